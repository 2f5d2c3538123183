"""The structconv console entry point."""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import official_archive

import structconv
from structconv.cli import PLANETOID_MODELS, PLANETOID_NAMES, build_parser, main
from structconv.experiments.cli_common import EXIT_STATUS, ArgumentParser
from structconv.theory.selfcheck import CheckResult, format_results


def test_check_passes_and_prints_a_table(capsys):
    assert main(["check", "--cases", "3", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "conv = einsum   [torch, sparse, xtheta]" in out
    assert "Prop. 3: compose = sequence" in out
    assert " 0 failed" in out


def test_check_rejects_unknown_backend(capsys):
    assert main(["check", "--backends", "jax"]) == 2
    assert "expected numpy and/or torch" in capsys.readouterr().err


def test_failed_identity_is_reported_as_failure():
    table = format_results([CheckResult("x", 1, 1.0, 1e-10), CheckResult("y", 1, 0.0, 1e-10)])
    assert "FAIL" in table and "1 passed, 1 failed" in table


def test_console_script_numpy_only_runs_without_importing_torch():
    code = (
        "import sys; from structconv.cli import main; "
        "rc = main(['check', '--cases', '2', '--backends', 'numpy']); "
        "assert 'torch' not in sys.modules; sys.exit(rc)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# --- command-line conventions (issue 16) ----------------------------------------------------------
COMMANDS = [[], ["check"], ["planetoid"], ["cifar"]] + [
    ["cifar", v] for v in ("train", "eval", "plot", "bench", "demo")
]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of a usage error (which must exit with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ")
    return err.strip().splitlines()[-1]


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += _parsers(child)
    return found


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "structconv")
def test_help_states_defaults_and_exit_statuses(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "exit status:\n  0  success\n  1  runtime failure" in out and "2  usage error" in out
    expected = {
        "check": ["random cases per identity (default: 12)", "(default: 0)"],
        "planetoid": ["(default: 10)", "(default: cora)", "(default: the paper's for each model)"],
        "cifar train": ["(default: fast)", "(default: resnet18)", "(default: runs/cifar)", "(default: the preset's)"],
        "cifar eval": ["(default: auto)", "(default: $STRUCTCONV_DATA"],
        "cifar plot": ["(default: <runs>/figures)"],
        "cifar bench": ["(default: 100)", "(default: 5)", "(default: benchmarks/results)"],
        "cifar demo": ["(default: cpu)", "(default: runs/cifar-demo)"],
    }.get(" ".join(command), [])
    flat = " ".join(out.split())  # help wraps lines
    for text in expected:
        assert text in flat, text
    if command and command[0] == "cifar" and len(command) == 2 and command[1] != "bench":
        assert "--cache" in flat and "$STRUCTCONV_CACHE" in flat and "never the data directory" in flat
        assert "beside" not in flat


def test_every_option_with_a_default_states_it() -> None:
    for parser in _parsers(build_parser()):
        assert isinstance(parser, ArgumentParser) and parser.epilog == EXIT_STATUS
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS and action.dest not in ("help", "version"):
                text = formatter._get_help_string(action) or ""
                if action.default not in (None, False, [], ""):
                    assert "default" in text, (parser.prog, action.option_strings)


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"structconv {structconv.__version__}\n"
    done = subprocess.run([sys.executable, "-m", "structconv.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"structconv {structconv.__version__}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cifar", "train", "--epochs", "0"], "--epochs must be a positive integer, got 0"),
        (["cifar", "demo", "--batch-size", "-8"], "--batch-size must be a positive integer, got -8"),
        (["cifar", "train", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["cifar", "train", "--lr", "0"], "--lr must be a positive number, got 0"),
        (["cifar", "train", "--test-subset", "0"], "--test-subset must be a positive integer, got 0"),
        (["cifar", "train", "--train-subset", "1.5"], "--train-subset must be a positive integer, got 1.5"),
        (["cifar", "train", "--time-limit", "-1"], "--time-limit must be a number >= 0, got -1"),
        (["cifar", "train", "--time-limit", "nan"], "--time-limit must be a number >= 0, got nan"),
        (["cifar", "bench", "--steps", "0"], "--steps must be a positive integer, got 0"),
        (["cifar", "bench", "--rounds", "x"], "--rounds must be a positive integer, got x"),
        (["cifar", "bench", "--batch", "0"], "--batch must be a positive integer, got 0"),
        (["cifar", "bench", "--peak-tflops", "inf"], "--peak-tflops must be a positive number, got inf"),
        (["planetoid", "--seeds", "0"], "--seeds must be a positive integer, got 0"),
        (["planetoid", "--epochs", "0"], "--epochs must be a positive integer, got 0"),
        (["check", "--cases", "0"], "--cases must be a positive integer, got 0"),
    ],
)
def test_a_bad_number_is_a_usage_error_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = " ".join(["structconv", *argv[: 2 if argv[0] == "cifar" else 1]])
    assert _fails(argv, capsys) == f"{prog}: error: {message}"


DEVICES = "--device must be auto or a device torch knows (cpu, cuda, cuda:N, mps, xpu, ...), got"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cifar", "train", "--device", "gpu"], f"{DEVICES} 'gpu'; did you mean cuda?"),
        (["cifar", "train", "--device", "GPU:1"], f"{DEVICES} 'GPU:1'; did you mean cuda:1?"),
        (["cifar", "eval", "run", "--device", "foo"], f"{DEVICES} 'foo'"),
        (["cifar", "bench", "--device", "CPU"], f"{DEVICES} 'CPU'; did you mean cpu?"),
        (["cifar", "demo", "--device", "cuda:x"], f"{DEVICES} 'cuda:x'; did you mean cuda?"),
        (["cifar", "bench", "--device", "XPU"], f"{DEVICES} 'XPU'; did you mean xpu?"),
        (["cifar", "bench", "--device", "xpus"], f"{DEVICES} 'xpus'; did you mean xpu?"),
        (["cifar", "bench", "--device", "MPS:0"], f"{DEVICES} 'MPS:0'; did you mean mps:0?"),
        (["cifar", "demo", "--device", "meta"], f"{DEVICES} 'meta': the meta device holds shapes, no values"),
    ],
)
def test_an_unknown_device_is_a_usage_error_with_the_right_spelling(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _fails(argv, capsys) == f"structconv cifar {argv[1]}: error: {message}"


def test_the_device_spellings_torch_knows_are_accepted() -> None:
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps", "mps:0", "xpu", "xpu:1"):
        assert build_parser().parse_args(["cifar", "bench", "--device", device]).device == device


def test_without_torch_the_device_is_checked_by_its_form(monkeypatch: pytest.MonkeyPatch) -> None:
    from structconv.experiments.cli_common import device_name

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert [device_name(d) for d in ("auto", "cpu", "cuda:1", "mps", "xpu")] == ["auto", "cpu", "cuda:1", "mps", "xpu"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"got 'GPU:1'; did you mean cuda:1\?"):
        device_name("GPU:1")


@pytest.mark.parametrize("kind", ["xpu", "mps"])
def test_a_device_type_that_is_not_here_is_a_usage_error(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if getattr(torch, kind).is_available():
        pytest.skip(f"this machine has {kind}")
    assert main(["cifar", "bench", "--device", kind]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--device {kind}: {kind.upper()} is not available on this machine" in err


def test_a_cuda_index_beyond_the_devices_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    index = torch.cuda.device_count()
    assert main(["cifar", "bench", "--device", f"cuda:{index}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--device cuda:{index}: " in err


def test_a_time_limit_of_zero_and_a_seed_of_zero_are_accepted() -> None:
    args = build_parser().parse_args(["cifar", "train", "--time-limit", "0", "--seed", "0"])
    assert args.time_limit == 0.0 and args.seed == 0 and not hasattr(args, "_structconv_parser")


UNRECOGNIZED = "error: unrecognized arguments:"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["cifar", "train", "--epoks", "3"], f"{UNRECOGNIZED} --epoks 3; did you mean --epochs?"),
        (["cifar", "train", "--batchsize=3"], f"{UNRECOGNIZED} --batchsize=3; did you mean --batch-size?"),
        (
            ["check", "--sed", "1", "--casse", "2"],
            f"{UNRECOGNIZED} --sed 1 --casse 2; did you mean --seed (for --sed), --cases (for --casse)?",
        ),
        (["cifar", "eval", "run", "--devise", "cpu"], f"{UNRECOGNIZED} --devise cpu; did you mean --device?"),
        (["cifar", "train", "--frobnicate"], f"{UNRECOGNIZED} --frobnicate; see 'structconv cifar train --help'"),
        (["chek"], "error: unknown command 'chek'; did you mean check?"),
        (["cifar", "trian"], "error: unknown command 'trian'; did you mean train?"),
        (["cifar", "train", "--preset", "fats"], "error: --preset: unknown preset 'fats'; did you mean fast?"),
        (["planetoid", "--name", "core"], "error: --name: unknown name 'core'; did you mean cora?"),
    ],
)
def test_a_misspelling_gets_the_near_names(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The near names only: not every option of the command."""
    known = [w for w in argv if w in ("check", "planetoid", "cifar", "train", "eval")]
    assert _fails(argv, capsys) == " ".join(["structconv", *known]) + ": " + line


def test_a_missing_command_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert _fails([], capsys).endswith("required: {check,planetoid,tour,cifar}")
    assert _fails(["cifar"], capsys).endswith("required: {train,eval,plot,bench,demo}")


def test_planetoid_names_are_the_readers() -> None:
    from structconv.data.planetoid import NAMES
    from structconv.experiments.planetoid import MODELS

    assert PLANETOID_NAMES == NAMES and PLANETOID_MODELS == MODELS
    from structconv.data.cifar import CACHE_ENV as DATA_CACHE_ENV
    from structconv.experiments.cifar.cli import CACHE_ENV

    assert CACHE_ENV == DATA_CACHE_ENV


def test_usage_errors_exit_2_and_runtime_failures_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"")  # a run that exists: the data is what is wrong
    assert main(["cifar", "eval", str(tmp_path / "run"), "--data", str(tmp_path / "absent")]) == 2
    assert f"structconv cifar eval: data directory {tmp_path / 'absent'} does not exist" in capsys.readouterr().err
    assert main(["cifar", "train", "--set", "warmup=2", "--data", str(tmp_path)]) == 2
    assert "--set got unknown setting 'warmup'; did you mean warmup_epochs?" in capsys.readouterr().err
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not a tar")  # a corrupt archive: a runtime failure
    capsys.readouterr()
    assert main(["cifar", "eval", str(tmp_path / "run"), "--data", str(tmp_path)]) == 1
    assert "not a readable tar archive" in capsys.readouterr().err


def test_eval_and_results_md_state_how_many_test_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    official_archive(data, per_batch=20)  # 100 training and 20 test images
    out = tmp_path / "runs"
    common = ["--preset", "smoke", "--model", "resnet18", "--data", str(data), "--device", "cpu", "--no-progress"]
    assert main(["cifar", "train", *common, "--out", str(out)]) == 0  # smoke: test_subset 16
    header, estimate = capsys.readouterr().out.splitlines()[:2]
    assert re.fullmatch(
        r"resnet18: [\d,]+ parameters \| device cpu, CPU \(\d+ threads?\) \| preset smoke: 1 epoch of 4 steps, batch 8",
        header,
    )
    assert re.fullmatch(
        r"resnet18: about .+ an epoch, .+ for the 1 epoch to go \(.+ a step, timed over steps? [\d-]+\)", estimate
    )
    results = (out / "results.md").read_text()
    assert "| test images |" in results.splitlines()[0]
    assert "| resnet18 | smoke | 1/1 |" in results and "% | 16 | CPU" in results
    assert "number of test images in its *test images* column (of a test split of 20;" in results
    assert main(["cifar", "train", *common, "--out", str(out), "--test-subset", "12", "--restart"]) == 0
    assert "% | 12 | CPU" in (out / "results.md").read_text()
    capsys.readouterr()
    assert main(["cifar", "eval", str(out / "resnet18-smoke"), "--data", str(data), "--device", "cpu"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{out / 'resnet18-smoke' / 'checkpoint.pt'}: resnet18 after epoch 1: test loss ")
    assert line.endswith(" % on 20 test images")


def test_results_table_counts_test_images_from_the_config(tmp_path: Path) -> None:
    from structconv.experiments.cifar.cli import count_test_images

    assert count_test_images({"test_subset": None}, []) == 10_000
    assert count_test_images({"test_subset": 1000}, []) == 1000
    assert count_test_images({"test_subset": 50_000}, []) == 10_000
    assert count_test_images({"test_subset": 1000}, [{"test_images": 999}]) == 999


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cifar", "bench", "--only", "=1"], "--only got unknown variants ['=1']"),
        (["cifar", "train", "--set", "key"], "--set expects key=value (e.g. lr=0.1), got 'key'"),
        (["cifar", "train", "--option", "key"], "--option expects key=value (e.g. heads=16), got 'key'"),
    ],
)
def test_a_malformed_option_is_named_with_a_usage_status(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_seed_torch_cannot_take_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.manual_seed takes 0 .. 2**64 - 1: a larger --seed (or --set seed=) is refused before the data is read."""
    from structconv.experiments.cifar.presets import TrainConfig

    for argv in (["--seed", str(2**64)], ["--set", f"seed={2**64}"]):
        assert main(["cifar", "train", *argv, "--data", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"seed must be an integer from 0 to 2**64 - 1 (torch.manual_seed's range), got {2**64}" in err
    assert TrainConfig("resnet18", seed=2**64 - 1).seed == 2**64 - 1


def test_a_batch_the_device_cannot_hold_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --batch whose input images alone exceed the device's memory is refused before torch allocates them."""
    argv = ["cifar", "bench", "--device", "cpu", "--sizes", "smoke", "--only", "resnet18", "--steps", "1"]
    for batch in (2**64, 10**12):
        assert main([*argv, "--rounds", "1", "--batch", str(batch), "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"structconv cifar bench: --batch {batch}: the input images" in err and "GiB on cpu" in err
    assert not list(tmp_path.iterdir())


def test_python_dash_m_runs_the_command_line() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "structconv", *args], capture_output=True, text=True, timeout=120)

    done = run("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"structconv {structconv.__version__}"
    usage = run("bogus")
    assert usage.returncode == 2


# --- near names, missing directories, presets (issue 31) ------------------------------------------
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["cifar", "train", "--model", "sa-quadratc"],
            "structconv cifar train: --model: unknown model 'sa-quadratc'; did you mean sa-quadratic?",
        ),
        (
            ["cifar", "train", "--model", "vgg"],
            "structconv cifar train: --model: unknown model 'vgg'; expected 'all' or comma-separated names of "
            "resnet18, sa-quadratic, sa-gaussian, sa-learned, sa-learned-content",
        ),
        (
            ["cifar", "train", "--model", "all", "--option", "heads=16"],
            "structconv cifar train: --option heads: model 'resnet18' takes no option 'heads' "
            "(its options: classes, width, channels, conv)",
        ),
        (
            ["cifar", "train", "--model", "resnet18", "--option", "widht=8"],
            "structconv cifar train: --option widht: model 'resnet18' takes no option 'widht' "
            "(its options: classes, width, channels, conv); did you mean width?",
        ),
        (
            ["cifar", "train", "--model", "sa-quadratic", "--option", "encoding=gaussian"],
            "structconv cifar train: --option encoding: model 'sa-quadratic' fixes encoding='quadratic'; "
            "choose another model instead (sa-gaussian, sa-learned, sa-learned-content)",
        ),
        (
            ["cifar", "train", "--set", "epoch=3"],
            "structconv cifar train: --set got unknown setting 'epoch'; did you mean epochs?",
        ),
        (["planetoid", "--model", "gnc"], "structconv planetoid: --model: unknown model 'gnc'; did you mean gcn?"),
        (
            ["planetoid", "--model", "gcn,,mlp"],
            "structconv planetoid: --model: unknown model 'mlp'; expected 'all' or comma-separated names of "
            "gcn, cheb, tag, gat",
        ),
        (["check", "--backends", "numpy,nunpy"], "structconv check: --backends got ['nunpy']; did you mean numpy?"),
    ],
)
def test_an_unknown_model_option_or_setting_is_one_line_with_the_near_names(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found before any data is read (the data directory here does not exist), in one line, with status 2."""
    data = ["--data", str(tmp_path / "absent")] if argv[0] != "check" else []
    assert main([*argv, *data]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_option_heds_for_sa_quadratic_names_every_option_and_suggests_heads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cifar", "train", "--model", "sa-quadratic", "--option", "heds=16", "--data", "absent"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith("; did you mean heads?")
    assert err.startswith(
        "structconv cifar train: --option heds: model 'sa-quadratic' takes no option 'heds' (its options: "
    )
    assert "heads, width, depth, ffn, dropout, attention_dropout" in err and "encoding" not in err


def test_model_options_are_the_constructors_keywords_less_the_fixed_ones() -> None:
    from structconv.experiments.cifar.cli import model_options
    from structconv.experiments.cifar.models import MODELS

    for name, entry in MODELS.items():
        expected = [p for p in inspect.signature(entry.build).parameters if p not in entry.fixed]
        assert list(model_options(name)) == expected, name
    assert "encoding" not in model_options("sa-gaussian") and "content" not in model_options("sa-learned-content")
    assert "heads" in model_options("sa-quadratic") and "width" in model_options("resnet18")


def test_usage_errors_of_the_console_script_are_one_line_without_a_traceback(tmp_path: Path) -> None:
    """Through the installed entry point, as a user meets them: status 2, the last line the message."""
    argv = [sys.executable, "-m", "structconv", "cifar", "train", "--data", str(tmp_path)]
    for extra, line in [
        (
            ["--device", "gpu"],
            "structconv cifar train: error: --device must be auto or a device torch knows "
            "(cpu, cuda, cuda:N, mps, xpu, ...), got 'gpu'; did you mean cuda?",
        ),
        (["--model", "sa-quadratic", "--option", "heds=16"], None),
    ]:
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        if line is None:  # no usage block above a check made after parsing: the message is all
            assert done.stderr.count("\n") == 1 and done.stderr.rstrip().endswith("did you mean heads?")
        else:
            assert done.stderr.startswith("usage: ") and done.stderr.rstrip().splitlines()[-1] == line


def test_a_missing_run_directory_is_a_usage_error_in_eval_and_plot_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Status 2 in both, found before the data is read (there is none here), in one line."""
    missing = tmp_path / "nonexistent"
    assert main(["cifar", "plot", str(missing), "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"structconv cifar plot: {missing}: no such directory\n"
    assert main(["cifar", "eval", str(missing), "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"structconv cifar eval: {missing}: no such run directory or checkpoint\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["cifar", "plot", str(empty), "--data", str(tmp_path)]) == 2
    assert "no run directories (holding a metrics.json) under" in capsys.readouterr().err
    assert main(["cifar", "eval", str(empty), "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"structconv cifar eval: {empty}: no checkpoint.pt in this directory\n"
    assert "a missing data directory, archive, run directory\n     or checkpoint" in EXIT_STATUS


def test_every_preset_smoke_included_is_documented_in_the_help_and_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    from structconv.experiments.cifar.names import CPU_PRESET, PRESET_DEVICES, PRESET_NAMES, PRESET_SUMMARIES

    assert tuple(PRESET_DEVICES) == tuple(PRESET_SUMMARIES) == PRESET_NAMES and PRESET_DEVICES[CPU_PRESET] == "cpu"
    with pytest.raises(SystemExit):
        main(["cifar", "train", "--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for name in PRESET_NAMES:
        assert f"  {name:6} {PRESET_DEVICES[name].upper()}: {PRESET_SUMMARIES[name]}\n" in out, name
    assert "--preset PRESET one of the presets above: paper, fast (GPU); demo, smoke (CPU)" in flat
    docs = (Path(__file__).resolve().parents[1] / "docs" / "cifar.rst").read_text()
    table = docs[docs.index("preset     settings") :]
    for name in PRESET_NAMES:
        assert f"\n``{name}``" in table, name


def test_bench_flushes_subnormals_on_a_cpu_and_no_flush_writes_a_record_named_unflushed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from structconv.backend.subnormals import thread_flushes

    before = thread_flushes()
    common = ["cifar", "bench", "--device", "cpu", "--sizes", "smoke", "--only", "resnet18", "--batch", "2"]
    common += ["--steps", "1", "--rounds", "1", "--out", str(tmp_path)]
    assert main(common) == 0
    assert main([*common, "--no-flush"]) == 0
    assert thread_flushes() == before  # the setting returns after the run
    flushed = json.loads((tmp_path / "cifar_throughput_cpu.json").read_text())
    kept = json.loads((tmp_path / "cifar_throughput_cpu_unflushed.json").read_text())
    assert kept["flush_denormal"] is False
    first = (tmp_path / "cifar_throughput_cpu_unflushed.txt").read_text().splitlines()[0]
    assert first.endswith("; subnormals unflushed for every variant")
    if flushed["flush_denormal_supported"]:
        assert flushed["flush_denormal"] is True
        first = (tmp_path / "cifar_throughput_cpu.txt").read_text().splitlines()[0]
        assert first.endswith("; subnormals flushed for every variant")
