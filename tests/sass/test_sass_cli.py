"""The `polytile sass-opt` command (listing mode, launch files, errors)."""

from __future__ import annotations

import json

from polytile.sass.cli import sass_opt_main


def test_list_shows_pins_and_legal_moves(sample_cubins, capsys):
    assert sass_opt_main([str(sample_cubins["sm_90a"]), "--kernel", "matmul", "--list"]) == 0
    out = capsys.readouterr().out
    assert "kernel matmul" in out and "pinned: branch" in out and "legal" in out and "[B" in out


def test_errors_are_one_line_and_exit_2(tmp_path, capsys, sample_cubins):
    assert sass_opt_main([str(tmp_path / "missing.cubin"), "--list"]) == 2
    assert "missing.cubin" in capsys.readouterr().err
    spec = tmp_path / "launch.json"
    spec.write_text(
        json.dumps(
            {
                "kernel": "saxpy",
                "grid": [1, 1, 1],
                "block": [32, 1, 1],
                "args": [
                    {"scalar": "n", "dtype": "int32", "value": 32},
                    {"buffer": "y", "dtype": "float32", "shape": [32], "role": "out"},
                ],
            }
        )
    )
    code = sass_opt_main(
        [str(sample_cubins["sm_90a"]), "--launch", str(spec), "-o", str(tmp_path / "o.cubin")]
    )
    assert code == 2 and "takes 4 parameters" in capsys.readouterr().err
