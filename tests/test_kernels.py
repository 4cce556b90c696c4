"""The compiled-op builder: every way a build can fail is a BuildError that names the fix and leaves no file."""

from __future__ import annotations

import pytest

from scope_marl.backends import kernels


def test_a_missing_compiler_is_a_build_error_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(kernels.BuildError, match="Fix: install g\\+\\+"):
        kernels.build(kernels.source("rows_attention"), tmp_path)
    assert not list(tmp_path.glob("*.so"))


def test_a_compile_error_is_a_build_error_and_leaves_no_file(tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    if kernels.compiler() is None:
        pytest.skip("no C++ compiler here")
    with pytest.raises(kernels.BuildError, match="could not compile broken.cpp"):
        kernels.build(broken, tmp_path / "kernels")
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.integration
def test_an_unwritable_cache_is_a_build_error_naming_the_fix(tmp_path):
    if kernels.compiler() is None:
        pytest.skip("no C++ compiler here")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be\n")
    with pytest.raises(kernels.BuildError, match="SCOPE_CACHE"):
        kernels.build(kernels.source("rows_attention"), blocker / "kernels")
