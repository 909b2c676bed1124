"""Vault values as Ansible writes them, read by gpuops without Ansible.

The envelopes below were made by ansible-vault 2.19 (`ansible-vault encrypt_string` / `encrypt`);
where ansible-vault is installed (the test extras install ansible-core) fresh ones are made too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuops.errors import InventoryError
from gpuops.inventory import load_inventory
from gpuops.inventory.loader import InventorySpec
from gpuops.inventory.vault import Vault, VaultSecret, VaultText, vault_from_options

# ansible-vault encrypt_string --vault-password-file pw1 's3cret-value' --name db_password  (pw1: first-pw)
DB_PASSWORD_11 = """\
db_password: !vault |
          $ANSIBLE_VAULT;1.1;AES256
          64386339353636656338636632626364303965313935666139626232646663333962303466336565
          6565383238653165653262353064373039626133346331300a653334613636393336333232623831
          39643936343533613532626534626362613861313766356438616138363233376139336566616232
          3333356238663139650a373131316631316463663430353431383664356163336536333264646238
          3262
"""
# ansible-vault encrypt_string --vault-id prod@pw2 'prod-token-value' --name api_token  (pw2: prod-pw)
API_TOKEN_12 = """\
api_token: !vault |
          $ANSIBLE_VAULT;1.2;AES256;prod
          63343437643833303733313232383136613739663361656139643931623064323330646230393166
          3734633766336231653930656431333531306565333966640a376533356363346235353834623734
          65613330306633613165376561656430313366626334303165383265326265383133303231666230
          3065333539356663620a303262396435353964393739653961646235653834386266633964623263
          38316232333765396336666236646166303831626530323665333735663765383765
"""
# ansible-vault encrypt --vault-id prod@pw2 of "whole_file_var: from-encrypted-file\nport: 30001\n"
WHOLE_FILE_12 = """\
$ANSIBLE_VAULT;1.2;AES256;prod
35343435613332353836323562643930313638343762623566393731643339306436383332333035
3632393234396435646364343636653135626335386237650a306461366664646431666233623964
62616265386465353830373464353161313138353131353765333061663465393731386330353666
6539376539636661370a623235396463663433323162323536346263363232316266383733373361
38636236326565383039373364333863363336396664313036376438376464653735366233356332
65333237393862666139656435646238376461633862343363333734336364336565343535383837
343436373030373038316262373462636538
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    write(tmp_path / "inv" / "hosts.yml", "all:\n  hosts:\n    gpu01: {ansible_host: 127.0.0.1}\n    gpu02:\n")
    write(tmp_path / "inv" / "group_vars" / "all.yml", DB_PASSWORD_11 + API_TOKEN_12)
    write(tmp_path / "inv" / "host_vars" / "gpu01.yml", WHOLE_FILE_12)
    write(tmp_path / "pw1", "first-pw\n")
    write(tmp_path / "pw2", "prod-pw\n")
    return tmp_path / "inv"


def test_values_and_files_from_ansible_vault_decrypt_with_their_passwords(inventory: Path, tmp_path: Path) -> None:
    vault = vault_from_options(password_files=[str(tmp_path / "pw1")], vault_ids=[f"prod@{tmp_path / 'pw2'}"])
    hosts = load_inventory(InventorySpec((str(inventory),), vault)).select(None)
    gpu01 = hosts[0].vars
    assert gpu01["db_password"] == "s3cret-value" and isinstance(gpu01["db_password"], VaultText)
    assert gpu01["api_token"] == "prod-token-value"
    assert gpu01["whole_file_var"] == "from-encrypted-file" and gpu01["port"] == 30001
    assert "s3cret" not in repr(gpu01["db_password"])  # a stray repr() shows no secret


def test_without_a_password_a_selected_host_fails_naming_file_and_variable(inventory: Path) -> None:
    os.environ.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    # The whole-file vault in host_vars/gpu01.yml is needed for gpu01's variables: selecting gpu01 fails ...
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(inventory)).select("gpu01")
    assert str(caught.value).startswith(f"{inventory}/host_vars/gpu01.yml is vault-encrypted (variables of host gpu01)")
    # ... and an inline !vault value fails only the command that selects a host using it.
    (inventory / "host_vars" / "gpu01.yml").unlink()
    loaded = load_inventory(str(inventory))
    with pytest.raises(InventoryError) as caught:
        loaded.select("gpu02")
    message = str(caught.value)
    assert message.startswith(f"{inventory}/group_vars/all.yml:1: variable db_password (host gpu02) is vault-encrypted")
    assert "--vault-password-file" in message and "\n" not in message


def test_a_host_left_out_by_limit_needs_no_password_for_its_encrypted_vars_file(tmp_path: Path) -> None:
    """``-l a3`` over an inventory whose host_vars/a1.yml is vault-encrypted as a whole: as in
    Ansible, only what the selected hosts need is decrypted, so no password is asked for."""
    os.environ.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    inv = write(tmp_path / "inv" / "hosts.yml", "all:\n  hosts:\n    a1:\n    a2:\n    a3: {ansible_port: 2203}\n").parent
    write(inv / "host_vars" / "a1.yml", WHOLE_FILE_12)
    write(tmp_path / "pw2", "prod-pw\n")
    loaded = load_inventory(str(inv))
    assert [h.name for h in loaded.select("a3")] == ["a3"] and loaded.select("a3")[0].port == 2203
    assert [h.name for h in loaded.select("a2:a3")] == ["a2", "a3"]
    for limit in ("a1", None, "all"):
        with pytest.raises(InventoryError, match=r"host_vars/a1.yml is vault-encrypted \(variables of host a1\): give"):
            loaded.select(limit)
    assert all("<vault-encrypted file>" not in h.vars for h in loaded.hosts)  # never a variable
    opened = load_inventory(InventorySpec((str(inv),), vault_from_options(vault_ids=[f"prod@{tmp_path / 'pw2'}"])))
    assert opened.select("a1")[0].vars["whole_file_var"] == "from-encrypted-file"


def test_with_a_password_only_the_selected_hosts_are_decrypted(tmp_path: Path) -> None:
    """With a password given, a host left out by --limit is never decrypted: a wrong password still
    serves ``-l a3`` (plain vars), and selecting a1 or a2 names that host's own file."""
    inv = write(tmp_path / "inv" / "hosts.yml", "all:\n  hosts:\n    a1:\n    a2:\n    a3: {ansible_port: 2203}\n").parent
    write(inv / "host_vars" / "a1.yml", WHOLE_FILE_12)  # encrypted with prod-pw
    write(inv / "host_vars" / "a2.yml", "a2_token: " + API_TOKEN_12.split(": ", 1)[1])  # inline, also prod-pw
    write(inv / "host_vars" / "a3.yml", "plain: yes\n")
    write(tmp_path / "pw", "prod-pw\n")
    write(tmp_path / "bad", "not-the-password\n")
    wrong = load_inventory(InventorySpec((str(inv),), vault_from_options(password_files=[str(tmp_path / "bad")])))
    assert [(h.name, h.port) for h in wrong.select("a3")] == [("a3", 2203)]  # nothing decrypted
    for limit, named in (("a1", "a1.yml"), ("a2", "a2.yml:1"), ("a3:a2", "a2.yml:1"), (None, "a1.yml")):
        with pytest.raises(InventoryError) as caught:
            wrong.select(limit)
        message = str(caught.value)
        assert message.startswith(f"{inv}/host_vars/{named}") and "no vault password given decrypts it" in message
        assert "\n" not in message and "not-the-password" not in message
    right = load_inventory(InventorySpec((str(inv),), vault_from_options(password_files=[str(tmp_path / "pw")])))
    assert right.select("a2")[0].vars["a2_token"] == "prod-token-value"
    assert right.select("a1")[0].vars["whole_file_var"] == "from-encrypted-file"
    assert right.select("a1")[0].vars["port"] == 30001
    assert [h.name for h in right.select("a2:a3")] == ["a2", "a3"]


def test_a_wrong_password_is_one_line_and_never_echoes_secrets(inventory: Path, tmp_path: Path) -> None:
    write(tmp_path / "bad", "not-the-password\n")
    (inventory / "host_vars" / "gpu01.yml").unlink()
    loaded = load_inventory(InventorySpec((str(inventory),), vault_from_options(password_files=[str(tmp_path / "bad")])))
    with pytest.raises(InventoryError) as caught:
        loaded.select("gpu01")  # decrypted when a command selects the host
    message = str(caught.value)
    assert "group_vars/all.yml:1" in message and "no vault password given decrypts it" in message
    assert "not-the-password" not in message and "s3cret" not in message


def test_vault_id_prefers_the_matching_label_and_falls_back_to_the_others(tmp_path: Path) -> None:
    envelope = API_TOKEN_12.split("|\n", 1)[1]
    envelope = textwrap.dedent(envelope)
    vault = Vault((VaultSecret("dev", b"wrong"), VaultSecret("other", b"prod-pw")))
    assert vault.decrypt(envelope, "x") == b"prod-token-value"


def test_password_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envelope = textwrap.dedent(DB_PASSWORD_11.split("|\n", 1)[1])
    script = tmp_path / "pass.sh"
    script.write_text("#!/bin/sh\necho first-pw\n")
    script.chmod(0o755)
    assert vault_from_options(password_files=[str(script)]).decrypt(envelope, "x") == b"s3cret-value"
    write(tmp_path / "pw1", "first-pw\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "pw1"))
    assert vault_from_options().decrypt(envelope, "x") == b"s3cret-value"
    assert vault_from_options(ask=True, prompt=lambda _: "first-pw").decrypt(envelope, "x") == b"s3cret-value"
    with pytest.raises(InventoryError, match="vault password file .*/missing does not exist"):
        vault_from_options(password_files=[str(tmp_path / "missing")])
    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\necho 'no keyring' >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(InventoryError, match="vault password script .*fail.sh failed: no keyring"):
        vault_from_options(password_files=[str(failing)])


def test_damaged_envelopes_are_refused_clearly() -> None:
    vault = Vault((VaultSecret("default", b"x"),))
    with pytest.raises(InventoryError, match="vault format 2.0 is not supported"):
        vault.decrypt("$ANSIBLE_VAULT;2.0;AES256\n00", "f.yml:3")
    with pytest.raises(InventoryError, match="cipher AES is not supported"):
        vault.decrypt("$ANSIBLE_VAULT;1.1;AES\n00", "f.yml:3")
    with pytest.raises(InventoryError, match="damaged"):
        vault.decrypt("$ANSIBLE_VAULT;1.1;AES256\nzz", "f.yml:3")


def _ansible_vault() -> str | None:
    beside = Path(sys.executable).parent / "ansible-vault"
    return str(beside) if beside.exists() else shutil.which("ansible-vault")


@pytest.mark.skipif(_ansible_vault() is None, reason="ansible-vault not installed")
def test_fresh_values_from_ansible_vault_with_hostile_plaintext(tmp_path: Path) -> None:
    plaintext = "pa$$ 'quoted' \"double\" \\ newline\nünïcode; $(touch /tmp/never)"
    write(tmp_path / "pw", "fresh-pw\n")
    done = subprocess.run([_ansible_vault(), "encrypt_string", "--vault-id", f"lab@{tmp_path / 'pw'}",
                           "--stdin-name", "hostile"], input=plaintext, capture_output=True, text=True,
                          check=True, timeout=120, env={**os.environ, "ANSIBLE_HOME": str(tmp_path / "ah")})
    write(tmp_path / "inv" / "hosts.yml", "all:\n  hosts:\n    h1:\n")
    (tmp_path / "inv" / "group_vars").mkdir()
    (tmp_path / "inv" / "group_vars" / "all.yml").write_text(done.stdout)
    vault = vault_from_options(vault_ids=[f"lab@{tmp_path / 'pw'}"])
    host = load_inventory(InventorySpec((str(tmp_path / "inv"),), vault)).select(None)[0]
    assert host.vars["hostile"] == plaintext
