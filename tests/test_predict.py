"""tracekit predict on real traces (the committed 2-node HSDP sample) and on hand-built programs.

The emulated-network validation (predicted against really shaped runs) is in
tests/test_predict_network.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SAMPLES, run_cli

from tracekit import prediction as P
from tracekit.analyses import network_replay as model
from tracekit.analyses.network_program import Call, Item, Program, common_origin
from tracekit.analysis import analyze
from tracekit.errors import TracekitError

HSDP = SAMPLES / "hsdp"


@pytest.fixture(scope="module")
def hsdp_model():
    return P.build(analyze(HSDP))


# ---------------------------------------------------------------- rates


@pytest.mark.parametrize(
    "text, bits",
    [
        ("400mbit", 4e8),
        ("1gbit", 1e9),
        ("10gbit", 1e10),
        ("1e9", 1e9),
        ("2500000", 2.5e6),
        ("50mbps", 4e8),  # tc: mbps is 10^6 bytes/s
        (" 1GBIT ", 1e9),
    ],
)
def test_rates_parse_like_tc(text: str, bits: float) -> None:
    assert P.parse_rate(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", ["4foo", "", "-1gbit", "0", "0mbit", "1 gbit/s", "nan"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(TracekitError, match="is not a rate"):
        P.parse_rate(text)


def test_sweep_bounds() -> None:
    assert P.parse_bandwidth("100mbit:100gbit") == (1e8, 1e11)
    assert P.parse_bandwidth("1gbit") == (1e9, None)
    with pytest.raises(TracekitError, match="LO < HI"):
        P.parse_bandwidth("1gbit:100mbit")
    pts = model.log_points(1e8, 1e11)
    assert pts[0] == pytest.approx(1e8) and pts[-1] == pytest.approx(1e11)
    assert all(b / a == pytest.approx(pts[1] / pts[0]) for a, b in zip(pts, pts[1:]))


# ---------------------------------------------------------------- the replay, by hand


def _program(rank: int, posts: list[tuple[int, str]], waits: list[tuple[int, str]], end: int):
    """A rank that posts calls at measured times and waits for them, then a step mark."""
    items = [Item("mark", 0, key=(0, "start"))]
    items += [Item("post", t, c, span_start_ns=t, span_end_ns=t, thread=c) for t, c in posts]
    items += [Item("wait", t, c) for t, c in waits]
    items.append(Item("mark", end, key=(0, "end")))
    items.sort(key=lambda i: (i.t_ns, {"post": 0, "mark": 1, "wait": 2}[i.kind]))
    return Program(rank, 0, end, items, [])


MS = 1_000_000


def test_a_call_starts_when_its_last_member_arrives() -> None:
    # rank 0 posts at 10 ms, rank 1 at 30 ms; both wait at 40 ms; 5 ms transfer, no bytes
    calls = {"c": Call("c", "all_reduce", [0, 1], 0, 5 * MS)}
    progs = {
        0: _program(0, [(10 * MS, "c")], [(40 * MS, "c")], 50 * MS),
        1: _program(1, [(30 * MS, "c")], [(40 * MS, "c")], 50 * MS),
    }
    rep = model.replay(progs, calls, model.Network(measured=True))
    # ends at 35 ms, before either rank needs it: nothing exposed, the step unchanged
    assert rep.step_time_s == {0: pytest.approx(0.05), 1: pytest.approx(0.05)}
    calls["c"].transfer_ns = 25 * MS  # now it ends at 55 ms: both ranks wait 15 ms
    rep = model.replay(progs, calls, model.Network(measured=True))
    assert rep.step_time_s[0] == pytest.approx(0.065)
    assert rep.exposed_comm_s[1] == pytest.approx(0.015)


def test_bytes_over_the_bandwidth_and_a_shared_nic() -> None:
    # two calls of two different groups leave node 0 at once: 5 MB each over 400 mbit (0.1 s
    # alone); one NIC serves them one after the other, so the second ends at 0.2 s
    nic = {(0, "out"): 5e6, (1, "in"): 5e6}
    calls = {
        "a": Call("a", "all_reduce", [0, 2], 0, 1 * MS, nic=dict(nic)),
        "b": Call("b", "all_reduce", [1, 3], 0, 1 * MS, nic=dict(nic)),
    }
    progs = {
        r: _program(r, [(0, c)], [(1 * MS, c)], 2 * MS)
        for r, c in ((0, "a"), (2, "a"), (1, "b"), (3, "b"))
    }
    rep = model.replay(progs, calls, model.Network(inter_bits=4e8))
    ends = sorted(rep.step_time_s.values())
    assert ends[:2] == [pytest.approx(0.1 + 0.001)] * 2  # waits at 1 ms: 0.1 s later + 1 ms work
    assert ends[2:] == [pytest.approx(0.2 + 0.001)] * 2
    # the floor wins when the network is fast: 1 ms of CPU per call, nothing exposed
    rep = model.replay(progs, calls, model.Network(inter_bits=1e12))
    assert max(rep.step_time_s.values()) == pytest.approx(0.002)
    # latency is paid per message step: 2(n-1) = 2 for an all_reduce of 2
    calls = {
        k: Call(c.call_id, c.op, c.members, 0, 0, nic={}, intra_bytes=1.0, hops=2)
        for k, c in calls.items()
    }
    rep = model.replay(progs, calls, model.Network(inter_bits=1e12, latency_s=0.01))
    assert max(rep.step_time_s.values()) == pytest.approx(0.02 + 0.001)


def test_ranks_whose_windows_start_apart_keep_one_clock() -> None:
    # rank 1's window starts 20 ms after rank 0's; both post at 30 ms and wait at 40 ms
    calls = {"c": Call("c", "all_reduce", [0, 1], 0, 5 * MS)}
    progs = {
        0: _program(0, [(30 * MS, "c")], [(40 * MS, "c")], 50 * MS),
        1: _program(1, [(30 * MS, "c")], [(40 * MS, "c")], 50 * MS),
    }
    progs[1].start_ns = 20 * MS
    progs[1].items[0].t_ns = 20 * MS  # its step starts with its window
    common_origin(progs)
    rep = model.replay(progs, calls, model.Network(measured=True))
    assert rep.exposed_comm_s == {0: 0.0, 1: 0.0}  # ends at 35 ms, needed at 40 ms
    assert rep.step_time_s[1] == pytest.approx(0.03)


def test_a_wait_that_never_resolves_is_a_deadlock() -> None:
    calls = {"c": Call("c", "all_reduce", [0, 1], 0, MS)}
    progs = {0: _program(0, [(0, "c")], [(MS, "c")], 2 * MS), 1: _program(1, [], [], 2 * MS)}
    with pytest.raises(ValueError, match="deadlocked"):
        model.replay(progs, calls, model.Network(measured=True))


# ---------------------------------------------------------------- a real 2-node trace


def test_own_conditions_give_the_measured_step(hsdp_model) -> None:
    pred = P.prediction(hsdp_model, None)
    sc = pred["self_check"]
    assert sc["measured_step_time_s"] > 0
    assert abs(sc["error"]) < 0.05, sc
    assert pred["step_time_s"] == sc["step_time_s"]


def test_slower_networks_give_slower_steps(hsdp_model) -> None:
    steps = [P.step_at(hsdp_model, b, None, 0.0) for b in (1e11, 1e9, 4e8, 1e8, 3e7)]
    assert all(a <= b + 1e-9 for a, b in zip(steps, steps[1:])), steps
    assert steps[-1] > 1.5 * steps[0]  # the replicas' all-reduce crosses nodes: it shows
    # intra-node traffic (the shard groups) gets slower only when an intra rate is given
    slow_intra = P.step_at(hsdp_model, 1e11, 1e8, 0.0)
    assert slow_intra > 1.2 * steps[0]


def test_sweep_knee_and_prediction_json(hsdp_model, tmp_path: Path) -> None:
    pred = P.prediction(hsdp_model, P.parse_bandwidth("10mbit:100gbit"))
    sw = pred["sweep"]
    free = pred["free_step_time_s"]
    knee = sw["knee_bits_per_s"]
    assert knee is not None and 1e7 < knee < 1e11, sw["knee_note"]
    # the knee's definition: 10 % slower than free communication there
    assert P.step_at(hsdp_model, knee, None, 0.0) == pytest.approx(1.1 * free, rel=0.01)
    assert P.step_at(hsdp_model, knee * 0.8, None, 0.0) > 1.1 * free
    assert sw["points"][0]["step_time_s"] > sw["points"][-1]["step_time_s"]
    target = P.write_prediction(pred, tmp_path / "prediction.json")
    back = json.loads(target.read_text())
    for key in ("step_time_s", "measured_step_time_s", "bandwidths", "ranks", "self_check"):
        assert key in back
    assert {r["rank"] for r in back["ranks"]} == {0, 1, 2, 3}
    for r in back["ranks"]:
        assert set(r) >= {"rank", "step_time_s", "comm_s", "exposed_comm_s"}
        assert r["exposed_comm_s"] <= r["step_time_s"]
    assert back["bandwidths"]["inter_node_bits_per_s"] == 1e7


def test_cli_predicts_and_writes(tmp_path: Path) -> None:
    out = tmp_path / "pred"
    r = run_cli("predict", str(HSDP), "--inter-node-bandwidth", "400mbit", "--out", str(out))
    assert r.returncode == 0, r.stderr
    pred = json.loads((out / "prediction.json").read_text())
    assert pred["bandwidths"]["inter_node_bits_per_s"] == 4e8
    assert "predicted step" in r.stdout and "measured" in r.stdout
    assert pred["step_time_s"] > pred["free_step_time_s"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--inter-node-bandwidth", "fast"], "is not a rate"),
        (["--inter-node-bandwidth", "1gbit", "--intra-node-bandwidth", "-3"], "is not a rate"),
        (["--inter-node-bandwidth", "1gbit:1mbit"], "LO < HI"),
        (["--inter-node-bandwidth", "1gbit", "--latency", "-5"], "microseconds"),
    ],
)
def test_cli_bad_values_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    r = run_cli("predict", str(HSDP), *args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: ") and message in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_non_regular_output(tmp_path: Path) -> None:
    (tmp_path / "o" / "prediction.json").mkdir(parents=True)
    r = run_cli(
        "predict", str(HSDP), "--inter-node-bandwidth", "1gbit", "--out", str(tmp_path / "o")
    )
    assert r.returncode == 2
    assert "not a regular file" in r.stderr and "Traceback" not in r.stderr


def test_a_trace_without_calls_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": 1,
                        "tid": 1,
                        "ts": 0,
                        "dur": 10,
                    },
                ]
            }
        )
    )
    r = run_cli(
        "predict", str(trace), "--inter-node-bandwidth", "1gbit", "--out", str(tmp_path / "o")
    )
    assert r.returncode == 2 and "nothing to predict" in r.stderr, r.stderr


def test_python_api_is_the_package_function(tmp_path: Path) -> None:
    import tracekit

    pred = tracekit.predict(HSDP, "1gbit", out=tmp_path)
    assert (tmp_path / "prediction.json").is_file()
    assert pred["bandwidths"]["inter_node_source"] == "given"


# ---------------------------------------------------------------- the Dash traffic page


@pytest.mark.slow
def test_dash_traffic_page_draws_the_curve(tmp_path: Path) -> None:
    """Real headless Chromium: /traffic of the 2-node HSDP sample shows the predicted curve
    with the measured run as a point on it."""
    import shutil
    import threading

    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("headless browser tests need /usr/bin/chromium")
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from dashboards.app import create_app

    root = tmp_path / "root"
    shutil.copytree(HSDP, root / "hsdp", ignore=shutil.ignore_patterns("analysis"))
    srv = make_server("127.0.0.1", 0, create_app(root).server, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{srv.server_port}/traffic?run=hsdp")
            page.wait_for_selector("#fig-predict-curve .main-svg", timeout=120_000)
            traces = page.locator("#fig-predict-curve g.trace.scatter")
            assert traces.count() == 3  # predicted, free communication, measured
            legend = page.locator("#fig-predict-curve .legend").text_content() or ""
            assert "measured" in legend and "free communication" in legend
            assert "knee" in (
                page.locator("#fig-predict-curve .main-svg").first.text_content() or ""
            ) + (page.locator("#fig-predict-curve .infolayer").text_content() or "")
            b.close()
    finally:
        srv.shutdown()
        thread.join(timeout=10)


def test_one_node_says_nothing_crosses_nodes(hsdp_model, tmp_path: Path) -> None:
    # the 2-node sample read as one node of 4: no call crosses nodes, the sweep is flat
    one = P.build(analyze(HSDP, ranks_per_node=4, cache=False))
    pred = P.prediction(one, P.parse_bandwidth("100mbit:100gbit"))
    assert pred["warnings"] == [P.one_node_warning(4)]
    assert "all 4 ranks on one node: nothing crosses nodes" in pred["warnings"][0]
    assert "--intra-node-bandwidth" in pred["warnings"][0]
    steps = {p["step_time_s"] for p in pred["sweep"]["points"]}
    assert max(steps) == pytest.approx(min(steps))
    # two nodes: no warning
    assert P.prediction(hsdp_model, P.parse_bandwidth("1gbit"))["warnings"] == []
    # the CLI on the one-node fsdp sample (2 ranks): one warning line, and in prediction.json
    r = run_cli(
        "predict", str(SAMPLES / "fsdp"), "--inter-node-bandwidth", "1gbit", "--out", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "warning: all 2 ranks on one node" in ln]
    assert len(lines) == 1, r.stdout
    assert json.loads((tmp_path / "prediction.json").read_text())["warnings"] == [
        P.one_node_warning(2)
    ]
