"""`gpuops tune`: sweep NCCL configurations on hosts safely, measure each, rank them, put hosts back."""
