"""Start-up permission checks on files that carry trust or secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from b300.errors import ConfigError
from b300.safety.permissions import check_not_writable_by_others, check_secret_file


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620, 0o666])
def test_secret_file_readable_or_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    secret = tmp_path / "smtp.pass"
    secret.write_text("s3cret\n")
    secret.chmod(mode)
    with pytest.raises(ConfigError, match="chmod 600") as err:
        check_secret_file(str(secret), "the SMTP password file")
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400])
def test_private_secret_file_is_accepted(tmp_path: Path, mode: int) -> None:
    secret = tmp_path / "smtp.pass"
    secret.write_text("s3cret\n")
    secret.chmod(mode)
    check_secret_file(str(secret), "the SMTP password file")


def test_missing_secret_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"smtp\.pass"):
        check_secret_file(str(tmp_path / "smtp.pass"), "the SMTP password file")


def test_group_writable_config_is_refused_but_missing_is_fine(tmp_path: Path) -> None:
    cfg = tmp_path / "b300.toml"
    check_not_writable_by_others(str(cfg), "config file")
    cfg.write_text("")
    cfg.chmod(0o664)
    with pytest.raises(ConfigError, match="chmod go-w"):
        check_not_writable_by_others(str(cfg), "config file")
    cfg.chmod(0o640)
    check_not_writable_by_others(str(cfg), "config file")
