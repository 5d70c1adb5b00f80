"""``pactrain-plan`` on a new user's inputs: loss curves, byte-rate links, sparse embeddings, models it cannot build,
clusters no method makes pay, ties, what ``--profile`` leaves unmeasured, and what ``--json`` holds."""

import json
from pathlib import Path

import pytest

from pactrain_hvd.planner import Prediction, load_curves, parse_method
from pactrain_hvd.planner.cli import link_bits_per_s, main, parser
from pactrain_hvd.planner.curves import metric_direction
from pactrain_hvd.planner.models import build_model, sparse_gradient_names
from pactrain_hvd.planner.payload import Tensor, pactrain_kept, prunable_names
from pactrain_hvd.planner.recommend import MIN_EFFICIENCY, STEP_TIE, Row, recommend

MODELS = Path(__file__).parent / "fixtures" / "planner_inputs.py"
LINK_FORMS = ("bits: 10gbit, 100mbit, 1.5Gbps, 100Mb/s, 100 Mbit/s; bytes (x8): 1GB/s, 10GBps, 100MB/s, 500kB/s, "
              "2 GByte/s")


def plan(capsys, *arguments: str, model: str = "lstm_lm") -> tuple[int, str, str]:
    """``main`` on a fixture model, 8 workers at 100 Mbit/s and a 50 ms step unless ``arguments`` say otherwise."""
    base = {"--model": f"{MODELS}:{model}", "--workers": "8", "--link": "100mbit", "--step-time": "0.05"}
    flags = [a for a in arguments if a in ("--profile", "--per-tensor")]
    pairs = [a for a in arguments if a not in flags]
    given = dict(zip(pairs[::2], pairs[1::2]))
    if "--profile" in flags:
        base.pop("--step-time")
    argv = [item for key, value in {**base, **given}.items() for item in (key, value)] + flags
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path: Path, document: dict, name: str = "curves.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


# 1. which way a curve's metric is better


@pytest.mark.parametrize("metric, higher", [
    ("val_loss", False), ("train-loss", False), ("val_perplexity", False), ("ppl", False), ("top1_error", False),
    ("word_error_rate", False), ("mse", False), ("val_mae", False), ("wer", False), ("cer", False),
    ("test_accuracy", True), ("acc", True), ("f1", True), ("bleu", True), ("roc_auc", True), ("mIoU", True),
    ("mAP", True), ("macro-F1", True),
    ("score", None), ("metric", None), ("accuracy_loss", None), ("bitmap_size", None)])
def test_metric_direction_from_its_name(metric, higher):
    assert metric_direction(metric) is higher


def test_a_loss_curve_is_lower_is_better(tmp_path):
    curves = load_curves(write(tmp_path, {"metric": "val_loss", "curves": {
        "dense": [[100, 3.0], [200, 2.5]], "fp16": [[100, 3.1], [200, 2.4]]}}))
    assert not curves.higher_is_better
    assert curves.default_target() == 2.5  # the worst final, which both reach
    assert curves.by_method["dense"].steps_to(2.5) == 200 and curves.by_method["fp16"].steps_to(2.5) == 200
    assert curves.best_final() == ("fp16", 2.4)


def test_higher_is_better_in_the_file_wins_over_the_name(tmp_path):
    curves = load_curves(write(tmp_path, {"metric": "val_loss_drop", "higher_is_better": True,
                                          "curves": {"dense": [[100, 0.1], [200, 0.3]]}}))
    assert curves.higher_is_better and curves.by_method["dense"].steps_to(0.2) == 200
    score = load_curves(write(tmp_path, {"metric": "score", "higher_is_better": False,
                                         "curves": {"dense": [[100, 9.0], [200, 5.0]]}}))
    assert score.by_method["dense"].steps_to(6.0) == 200


def test_loss_curves_end_to_end_pick_by_the_time_to_the_lower_loss(capsys, tmp_path):
    curve = write(tmp_path, {"metric": "val_loss", "workers": 2, "target": 2.5, "curves": {
        "dense": [[100, 3.0], [200, 2.5]], "fp16": [[100, 3.1], [200, 2.6], [400, 2.5]]}})
    out_json = tmp_path / "plan.json"
    code, out, _ = plan(capsys, "--methods", "dense,fp16", "--curve", curve, "--json", str(out_json))
    assert code == 0
    rows = {row["method"]: row for row in json.loads(out_json.read_text())["rows"]}
    assert rows["dense"]["steps_to_target"] == 200 and rows["fp16"]["steps_to_target"] == 400
    assert f"- accuracy curves from {curve}: val_loss, lower is better, measured on 2 workers, target 2.5;" in out


@pytest.mark.parametrize("document, message", [
    ({"metric": "score", "curves": {"dense": [[1, 0.5]]}},
     "cannot tell from the metric's name 'score' whether higher is better: add \"higher_is_better\": true or false "
     "to the file"),
    ({"curves": {"dense": [[1, 0.5]]}},
     "cannot tell from the metric's name 'metric' whether higher is better: add \"higher_is_better\": true or false "
     "to the file"),
    ({"metric": "score", "higher_is_better": "yes", "curves": {"dense": [[1, 0.5]]}},
     "'higher_is_better' must be true or false, got 'yes'"),
])
def test_a_metric_of_unknown_direction_is_refused(tmp_path, document, message):
    path = write(tmp_path, document)
    with pytest.raises(ValueError) as error:
        load_curves(path)
    assert str(error.value) == f"--curve {path}: {message}"


# 2. link rates in bytes and bits


@pytest.mark.parametrize("text, bits", [
    ("1GB/s", 8e9), ("10GBps", 80e9), ("100MB/s", 800e6), ("500kB/s", 4e6), ("2 GByte/s", 16e9), ("1 gbyte", 8e9),
    ("10gbit", 10e9), ("100mbit", 100e6), ("1.5Gbps", 1.5e9), ("100Mb/s", 100e6), ("100 Mbit/s", 100e6),
    ("10 Gbits/s", 10e9), ("1GBit/s", 1e9), ("25 gbps", 25e9)])
def test_link_rates_in_bytes_and_bits(text, bits):
    assert link_bits_per_s(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", ["10", "10G", "1GBPS", "fast", "0gbit", "1 MiB/s"])
def test_an_ambiguous_link_is_refused_with_the_accepted_forms(text):
    with pytest.raises(ValueError) as error:
        link_bits_per_s(text)
    assert str(error.value) == f"--link {text!r}: give a rate > 0 with its unit, {LINK_FORMS}"


def test_the_link_is_shown_in_gbit_and_gbyte(capsys):
    code, out, _ = plan(capsys, "--link", "1GB/s", "--methods", "dense")
    assert code == 0
    assert "- link 1GB/s = 8 Gbit/s = 1 GB/s each way per worker" in out


# 3. sparse gradients


def test_sparse_embedding_gradients_are_named_in_a_warning(capsys, tmp_path):
    assert sparse_gradient_names(build_model(f"{MODELS}:lstm_lm")) == ["embed.weight"]
    assert sparse_gradient_names(build_model(f"{MODELS}:encoder")) == []
    out_json = tmp_path / "plan.json"
    code, out, _ = plan(capsys, "--methods", "dense,topk", "--json", str(out_json))
    assert code == 0
    warning = ("embed.weight: sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True), modelled here as "
               "dense tensors in every row; Horovod allgathers only the rows a step touches, with their indices, "
               "unless sparse_as_dense=True, so the dense, fp16, Top-k and PowerSGD rows can overstate their bytes "
               "many times; PacTrain sends a pruned sparse gradient dense, as modelled, and an unpruned one (see "
               "--prunable) as Horovod does")
    assert f"\nWarning: {warning}.\n" in out
    assert json.loads(out_json.read_text())["warnings"] == [warning]
    code, out, _ = plan(capsys, "--methods", "dense", model="encoder")
    assert code == 0 and "Warning" not in out


# 4. one-line errors, nothing printed before them


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_for_the_planner\n")
    listed = write(tmp_path, {"metric": "accuracy", "curves": [[100, 0.5]]}, "listed.json")
    worded = write(tmp_path, {"metric": "accuracy", "target": "0.9", "curves": {"dense": [[100, 0.5]]}}, "worded.json")
    unknown = write(tmp_path, {"metric": "accuracy", "curves": {"sgd": [[100, 0.5]]}}, "unknown.json")
    return [
        (["--model", f"{MODELS}:needs_width"],
         f"--model '{MODELS}:needs_width': needs_width needs arguments (width); name a function that builds the model "
         "without arguments, e.g. def make(): return Net(...)"),
        (["--model", f"{broken}:make"],
         f"--model '{broken}:make': importing {broken} failed (ModuleNotFoundError: No module named "
         "'no_such_module_for_the_planner')"),
        (["--model", f"{MODELS}:reads_values"],
         f"--model '{MODELS}:reads_values': building the model on torch's meta device failed (RuntimeError: "
         "Tensor.item() cannot be called on meta tensors): that device holds shapes, not values, so code that reads "
         "a tensor's value while building (such as .item()) fails there; --profile builds the model on the CPU"),
        (["--curve", listed],
         f"--curve {listed}: 'curves' must be a non-empty object of method name -> [[step, metric], ...], got a list"),
        (["--curve", worded], f"--curve {worded}: 'target' must be a number, got '0.9'"),
        (["--curve", unknown],
         f"--curve {unknown}: curve 'sgd': unknown method 'sgd': use dense, fp16, topk[-DENSITY], powersgd[-rRANK], "
         "pactrain-SPARSITY[-fp16|-bf16|-ternary|-int3][-syncH] or diloco-hH-fp16|fp32"),
        (["--json", str(tmp_path / "missing" / "plan.json")],
         f"--json {tmp_path / 'missing' / 'plan.json'}: no such folder {tmp_path / 'missing'}"),
        (["--step-time", "inf"], "--step-time must be a finite number > 0, got inf"),
        (["--step-time", "nan"], "--step-time must be a finite number > 0, got nan"),
        (["--step-time", "-1"], "--step-time must be a finite number > 0, got -1"),
        (["--update-time", "nan"], "--update-time must be a finite number >= 0, got nan"),
        (["--target", "inf"], "--target must be a finite number, got inf"),
        (["--compress-time", "topk=abc"], "--compress-time 'topk=abc': SECONDS must be a finite number >= 0, got 'abc'"),
        (["--compress-time", "topk=-1"], "--compress-time 'topk=-1': SECONDS must be a finite number >= 0, got '-1'"),
        (["--prunable", "nothing.*"],
         "--prunable 'nothing.*' matches no trainable tensor (their names look like embed.weight, lstm.weight_ih_l0, "
         "lstm.weight_hh_l0)"),
        (["--per-tensor", "--methods", "dense"],
         "--per-tensor breaks down a PacTrain method: --methods has none (e.g. add pactrain-0.9-fp16)"),
    ]


BAD = ["needs arguments", "import fails", "reads values on meta", "curves a list", "target a string",
       "unknown method in a curve", "json folder missing", "step inf", "step nan", "step negative", "update nan",
       "target inf", "compress not a number", "compress negative", "prunable matches nothing", "per-tensor no pactrain"]


@pytest.mark.parametrize("case", range(len(BAD)), ids=BAD)
def test_bad_input_is_one_line_naming_it(capsys, tmp_path, case):
    cases = _bad_inputs(tmp_path)
    assert len(cases) == len(BAD)
    arguments, message = cases[case]
    code, out, err = plan(capsys, *arguments)
    assert (code, out, err) == (2, "", f"pactrain-plan: error: {message}\n")
    assert not (tmp_path / "missing").exists()


# 5. a target no curve reaches


def test_a_target_no_curve_reaches_names_the_best_final(capsys, tmp_path):
    curve = write(tmp_path, {"metric": "accuracy", "workers": 2, "curves": {
        "dense": [[100, 0.6], [200, 0.7]], "pactrain-0.9-fp16": [[100, 0.6], [200, 0.65]]}})
    code, out, _ = plan(capsys, "--methods", "dense,pactrain-0.9-fp16", "--curve", curve, "--target", "0.99",
                        "--workers", "2", "--link", "1gbit")
    assert code == 0
    assert ("no method reaches the target 0.99 in its curve (the best final accuracy is 0.7, dense), so accuracy was "
            "not compared: a --target the curves reach compares the time to it.") in out
    assert "without an accuracy curve" not in out


# 6. latency: one way, a LAN's by default


def test_latency_is_documented_as_one_way_with_a_lan_default(capsys):
    text = " ".join(parser().format_help().split())
    assert ("one-way latency per message hop, ms (default 0.01: a LAN; between sites give the one-way latency, "
            "typically 10-50 ms)") in text
    code, out, _ = plan(capsys, "--methods", "dense")
    assert ("0.01 ms one way per message hop (the default: a LAN's; between sites pass the one-way latency, "
            "typically 10-50 ms)") in out
    code, out, _ = plan(capsys, "--methods", "dense", "--latency-ms", "20")
    assert "20 ms one way per message hop, ring collectives" in out


# 7. a cluster no method makes pay


def test_no_method_makes_a_cluster_pay_below_the_threshold(capsys, tmp_path):
    assert MIN_EFFICIENCY == 0.25
    out_json = tmp_path / "plan.json"
    code, out, _ = plan(capsys, "--workers", "16", "--link", "10mbit", "--step-time", "0.01", "--methods",
                        "dense,topk,pactrain-0.9", "--json", str(out_json), model="encoder")
    assert code == 0
    saved = json.loads(out_json.read_text())
    best = max(saved["rows"], key=lambda row: row["efficiency"])
    assert saved["choice"] is None and best["efficiency"] < MIN_EFFICIENCY
    assert (f"Recommendation: none: no method makes this cluster pay: the best, {best['method']}, runs at "
            f"{best['efficiency']:.0%} scaling efficiency (every method is below 25%), so 16 workers do "
            f"{16 * best['efficiency']:.2g}x one worker's work a step") in out


# 8. ties: the method that changes the model least


def _row(name: str, step_s: float, handed_bytes: int) -> Row:
    return Row(Prediction(parse_method(name), handed_bytes, handed_bytes, step_s, compute_s=0.09, compress_s=0.0,
                          wait_s=step_s - 0.09))


@pytest.mark.parametrize("names, picked", [
    (["topk", "pactrain-0.9"], "topk"),  # a 90 %-pruned model is a bigger change than Top-k's updates
    (["pactrain-0.9-ternary", "pactrain-0.9-fp16"], "pactrain-0.9-fp16"),
    (["pactrain-0.95-fp16", "pactrain-0.9-ternary"], "pactrain-0.9-ternary"),  # lower sparsity first
    (["pactrain-0.98", "fp16"], "fp16"),
    (["pactrain-0.5", "powersgd"], "powersgd"),
])
def test_a_tie_picks_the_method_that_changes_the_model_least(names, picked):
    # the first name has the shorter step and, where it matters, the more bytes: the old rule picked it
    table = [_row(names[0], 0.100, 2_000_000), _row(names[1], 0.100 * (1 + STEP_TIE / 2), 1_000_000),
             _row("dense", 0.5, 8_000_000)]
    choice, reason = recommend(table)
    assert choice == picked
    assert reason.startswith(f"of the 2 methods within 5% of the shortest step ({names[0]}, {names[1]}), the one that "
                             "changes the model least")
    assert reason.endswith("accuracy was not compared: without an accuracy curve (--curve) the steps each method needs "
                           "are unknown, and a curve decides")


# 9. what --profile leaves unmeasured


def test_profile_says_what_it_did_not_measure(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    code, out, _ = plan(capsys, "--profile", "--input-shape", "6", "--batch-size", "2", "--token-inputs", "1000",
                        "--methods", "dense,topk,pactrain-0.9-fp16,pactrain-0.95-ternary")
    assert code == 0
    assert ("- PacTrain's compression timed once, a gather and scatter of the survivors at 0.9 sparsity with fp32 "
            "values (no quantization), and charged to every PacTrain row (pactrain-0.9-fp16, pactrain-0.95-ternary)"
            ) in out
    assert "- Top-k's compression timed at 1 % and charged to every Top-k row (topk)" in out
    assert ("- compute and compression measured on this machine's CPU and not scaled to an accelerator: for a GPU "
            "cluster, time a step there and pass --step-time and --compress-time") in out


# 10. --json, --prunable, --per-tensor, --help


def test_json_holds_the_inputs_the_step_split_and_the_curve_workers(capsys, tmp_path):
    curve = write(tmp_path, {"metric": "accuracy", "workers": 2, "curves": {
        "dense": [[100, 0.6], [200, 0.7]], "topk": [[100, 0.7]]}})
    out_json = tmp_path / "plan.json"
    code, _, _ = plan(capsys, "--methods", "dense,topk,pactrain-0.9-fp16", "--curve", curve, "--json", str(out_json),
                      "--prunable", "lstm.*,decoder.*", model="lstm_lm")
    assert code == 0
    saved = json.loads(out_json.read_text())
    inputs = saved["inputs"]
    assert inputs["workers"] == 8 and inputs["link"] == "100mbit" and inputs["link_bits_per_s"] == 100e6
    assert inputs["prunable"] == "lstm.*,decoder.*" and inputs["step_time"] == 0.05 and inputs["per_tensor"] is False
    assert set(inputs) >= {action.dest for action in parser()._actions if action.dest not in ("help", "version")}
    assert saved["curve"] == {"source": curve, "metric": "accuracy", "higher_is_better": True, "workers": 2}
    for row in saved["rows"]:
        assert row["compute_s"] == pytest.approx(0.05)
        assert row["compute_s"] + row["compress_s"] + row["wait_s"] == pytest.approx(row["step_s"])
    assert [row["curve_workers"] for row in saved["rows"]] == [2, 2, None]


def test_prunable_globs_keep_the_embedding_dense(capsys, tmp_path):
    tensors = [Tensor("embed.weight", (1000, 64)), Tensor("lin.weight", (64, 64)), Tensor("lin.bias", (64,))]
    assert prunable_names(tensors) == ["embed.weight", "lin.weight"]
    assert prunable_names(tensors, ["lin.*"]) == ["lin.weight", "lin.bias"]  # as the library's prunable= globs
    assert pactrain_kept(parse_method("pactrain-0.9"), tensors, "layer", ["lin.weight"]) == {"lin.weight": 410}
    out_json = tmp_path / "plan.json"
    code, out, _ = plan(capsys, "--methods", "pactrain-0.9-fp16", "--prunable", "lstm.weight*,decoder.weight",
                        "--per-tensor", "--json", str(out_json))
    assert code == 0
    assert "| embed.weight | 1000x64 | 64,000 | dense | 128 kB |" in out
    assert "| decoder.bias | 1000 | 1,000 | dense | 2 kB |" in out
    assert "- PacTrain prunes 3 of 7 tensors (0.10 M parameters): those --prunable lstm.weight*,decoder.weight matches" in out
    saved = json.loads(out_json.read_text())
    per_tensor = {t["name"]: t for t in saved["per_tensor"]["tensors"]}
    assert per_tensor["embed.weight"] == {"name": "embed.weight", "shape": [1000, 64], "numel": 64_000,
                                          "pruned": False, "kept": None, "packed": False, "bytes": 128_000}
    assert per_tensor["decoder.weight"]["pruned"] and per_tensor["decoder.weight"]["packed"]
    assert sum(t["bytes"] for t in per_tensor.values()) == saved["rows"][0]["handed_bytes"]


def test_per_tensor_follows_the_first_pactrain_method(capsys):
    code, out, _ = plan(capsys, "--methods", "dense,pactrain-0.9-fp16,pactrain-0.98", "--per-tensor", "--ranking",
                        "layer", model="encoder")
    assert code == 0
    assert "Per tensor, pactrain-0.9-fp16:" in out
    # 1000 x 64 at 0.9, layer ranking: 6,400 kept, fp16 values
    assert "| 0.weight | 1000x64 | 64,000 | pruned, 6,400 kept, packed | 12.8 kB |" in out
    assert "| 5.bias | 10 | 10 | dense | 20 B |" in out


def test_help_documents_the_method_names_and_token_inputs():
    text = " ".join(parser().format_help().split())
    assert ("dense, fp16, topk[-DENSITY] (default 0.01), powersgd[-rRANK] (default rank 4), "
            "pactrain-SPARSITY[-fp16|-bf16|-ternary|-int3][-syncH]") in text and "diloco-hH-fp16|fp32" in text
    assert ("--token-inputs VOCABULARY --profile: feed random integer token ids in [0, VOCABULARY) of --input-shape "
            "(a language model), instead of normal floats") in text
    assert "--prunable GLOB[,GLOB...]" in text and "--per-tensor" in text


def test_version_is_the_package_version(capsys):
    import pactrain_hvd
    from pactrain_hvd.planner.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pactrain-plan {pactrain_hvd.__version__}"
