"""The formatters' common form is kept on disk, named by what it is a function of: a second
process reads it instead of running black and isort over a large ``schema.py`` again."""

from __future__ import annotations

import pytest

from contractgen.codegen import formatters
from contractgen.codegen.formatters import Formatter, common_form

SOURCE = "import sys\nimport os\nx = {'a':1,\n}\n"
BLACK = (Formatter("miles", "black", (("line-length", 119),)),)


@pytest.fixture(autouse=True)
def _fresh_process_cache():
    common_form.cache_clear()
    yield
    common_form.cache_clear()


def test_a_second_process_reads_the_form_from_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTRACTGEN_CACHE_DIR", str(tmp_path))
    form = common_form(SOURCE, BLACK, "schema.py")
    assert form == 'import sys\nimport os\n\nx = {\n    "a": 1,\n}\n'
    assert len(list((tmp_path / "format").iterdir())) == 1
    common_form.cache_clear()  # as a new process would start

    def no_formatting(*args):
        raise AssertionError("the cached form was computed again")

    monkeypatch.setattr(formatters, "_common_form", no_formatting)
    assert common_form(SOURCE, BLACK, "schema.py") == form


def test_other_settings_are_another_entry(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTRACTGEN_CACHE_DIR", str(tmp_path))
    narrow = (
        Formatter("fork", "black", (("line-length", 100), ("skip-string-normalization", True))),
    )
    assert common_form(SOURCE, BLACK, "p") != common_form(SOURCE, narrow, "p")
    assert len(list((tmp_path / "format").iterdir())) == 2


def test_an_empty_cache_dir_turns_the_cache_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTRACTGEN_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert common_form(SOURCE, BLACK, "p").startswith("import sys")
    assert not any(tmp_path.iterdir())
