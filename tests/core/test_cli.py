"""The command line: `polytile run`, `polytile ops`, and clear errors."""

import os
import re
import subprocess
import sys

import pytest


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "polytile.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_run_matmul_prints_time_and_numpy():
    proc = run("run", "matmul", "--shape", "64,48,40", "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    assert "relative error" in proc.stdout and "(ok)" in proc.stdout
    assert "GFLOP/s" in proc.stdout and "numpy" in proc.stdout


def test_run_with_named_sizes_and_source():
    proc = run("run", "softmax", "--shape", "M=8,N=33", "--show-source", "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    assert 'extern "C"' in proc.stdout


def test_ops_lists_operators():
    proc = run("ops")
    assert proc.returncode == 0 and "matmul" in proc.stdout and "spmm" in proc.stdout


def test_unknown_operator_is_a_clear_error():
    proc = run("run", "matmull")
    assert proc.returncode == 2
    assert "unknown operator 'matmull'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.needs_nvcc
def test_run_cuda_without_gpu_compiles_and_reports_resources():
    proc = run("run", "matmul", "--shape", "64,48,40", "--target", "cuda:sm_90a", "--source",
               env={"POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 0, proc.stderr
    assert 'extern "C" __global__' in proc.stdout and "(sm_90a)" in proc.stdout
    assert re.search(r"kernel matmul_kernel0: grid \(\d+, \d+, 1\), block \(\d+, \d+, 1\);", proc.stdout)
    assert "registers" in proc.stdout and "B spilled" in proc.stdout
    assert "no GPU found: the kernel was compiled for sm_90a but not run" in proc.stdout


@pytest.mark.needs_nvcc
def test_run_cuda_tensor_cores_with_dtype():
    proc = run("run", "matmul", "--shape", "M=64,N=64,K=64", "--dtype", "float16", "--target", "cuda:sm_80",
               "--source", env={"POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "mma.sync.aligned.m16n8k16" in proc.stdout and "(sm_80)" in proc.stdout


def test_unknown_cuda_architecture_is_a_clear_error():
    proc = run("run", "matmul", "--shape", "64,48,40", "--target", "cuda:sm_12", env={"POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 2
    assert "'sm_12' is not a known architecture" in proc.stderr and "Traceback" not in proc.stderr


BAD_ARGUMENTS = {
    ("run", "matmull"): "unknown operator 'matmull'; known: batch_matmul, conv2d",
    ("run", "matmul", "--shape", "512,,5"): "an empty entry; write sizes as 512,512,512",
    ("run", "matmul", "--shape", "4.5,3,3"): "M must be an integer, got '4.5'",
    ("run", "matmul", "--shape", "X=5"): "matmul has no argument 'X'; its arguments: M, N, K, dtype",
    ("run", "matmul", "--shape", "4,4,4,4"): "matmul takes 3 sizes (M, N, K); got more",
    ("run", "matmul", "--shape", "5"): "matmul also needs N, K (its sizes: M, N, K)",
    ("run", "matmul", "--shape", "0,4,4"): "M must be at least 1, got 0",
    ("run", "matmul", "--shape", "8,8,8,split_k=two"): "split_k must be an integer, got 'two'",
    ("run", "matmul", "--shape", "8,8,8,split_k=0"): "split_k must be at least 1, got 0",
    ("run", "matmul", "--shape", "4,M=4"): "M is given twice",
    ("run", "conv2d", "--shape", "N=1,C=4,H=8,W=8,K=4,R=3,S=3,padding=-1"): "padding must be at least 0",
    ("run", "matmul", "--shape", "8,8,8", "--dtype", "float17"): "unknown dtype 'float17'; use one of float16",
    ("run", "matmul", "--shape", "8,8,8,dtype=half8"): "unknown dtype 'half8'; use one of float16",
    ("run", "matmul", "--shape", "8,8,8", "--target", "gpu"): "unknown target 'gpu'; use 'cpu', 'cuda'",
    ("run", "dense", "--shape", "8,8,8,activation=gelu"): "unknown activation 'gelu'; use 'relu' or 'none'",
    ("run", "matmul", "--repeat", "0"): "argument --repeat: expected a positive integer, got 0",
    ("frobnicate",): "argument command: invalid choice: 'frobnicate' (choose from 'run', 'ops', 'tune', 'sass-opt', "
                     "'tune-model', 'tlm', 'fuzz')",
    ("tune", "matmul", "--shape", "8,8,8", "--tuner", "genetic"): "invalid choice: 'genetic' (choose from 'xgb'",
    ("tune", "matmul", "--shape", "8,8,8", "--target", "tpu"): "unknown target 'tpu'; use 'cpu', 'cuda'",
    ("tune", "matmul", "--shape", "8,8;8"): "N must be an integer, got '8;8'",
    ("tune", "spmm", "--shape", "8,8,8,8"): "no tuning template for operator 'spmm' on cpu; templates exist for",
    ("tune", "matmul", "--shape", "8,8,8", "--template", "nosuch"): "no tuning template named 'nosuch'; known:",
}


@pytest.mark.parametrize("argv", list(BAD_ARGUMENTS), ids=lambda a: " ".join(a))
def test_bad_arguments_are_one_line_errors_listing_the_choices(capsys, argv):
    from polytile.cli import main
    try:
        rc = main(list(argv))
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("polytile") and "Traceback" not in err, err
    assert BAD_ARGUMENTS[argv] in lines[0]


def test_run_takes_a_split_of_k():
    proc = run("run", "matmul", "--shape", "37,45,96,split_k=4", "--dtype", "int8", "--repeat", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "split_k=4" in proc.stdout
    assert "(ok)" in next(ln for ln in proc.stdout.splitlines() if "relative error" in ln)


@pytest.mark.parametrize("op,dtype", [("layernorm", "bfloat16"), ("softmax", "float16"), ("matmul", "int8")])
def test_run_judges_16_bit_and_integer_results_by_their_type(op, dtype):
    proc = run("run", op, "--shape", "29,77" if op != "matmul" else "67,45,89", "--dtype", dtype, "--repeat", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "relative error" in ln)
    assert "(ok)" in line
    assert ("exact result required" in line) if dtype == "int8" else ("tolerance" in line)
