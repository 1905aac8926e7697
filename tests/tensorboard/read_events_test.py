"""Reads what klserve's TensorBoardWriter wrote with TensorBoard's own reader.

tensorboard_write_sample (tensorboard_write_sample.cc) writes a fixed set of
scalars; EXPECTED below mirrors it. Needs `pip install tensorboard pytest`
and KLSERVE_TB_SAMPLE set to the sample binary's path, e.g.

  KLSERVE_TB_SAMPLE=build/tests/tensorboard/tensorboard_write_sample \
      python -m pytest tests/tensorboard/read_events_test.py
"""

import math
import os
import struct
import subprocess

import pytest

SAMPLE = os.environ.get("KLSERVE_TB_SAMPLE")
if not SAMPLE:
    pytest.skip(
        "KLSERVE_TB_SAMPLE is unset: set it to the tensorboard_write_sample "
        "binary (build/tests/tensorboard/tensorboard_write_sample)",
        allow_module_level=True,
    )

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard pip package is not installed in this Python",
)
event_multiplexer = pytest.importorskip(
    "tensorboard.backend.event_processing.event_multiplexer",
    reason="the tensorboard pip package is not installed in this Python",
)


def f32(x):
    """x rounded to float32, as the writer's static_cast<float> does."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


BASE_WALL_TIME = 1700000000.25

# (tag, step, float32 value) in the order the sample writes them; point i is
# stamped BASE_WALL_TIME + i.
POINTS = (
    [("loss/kl", s, f32(1.0 / (s + 1))) for s in range(10)]
    + [("loss/recall", s, f32(s * 0.01)) for s in range(0, 100, 10)]
    + [
        ("edge", 0, 0.0),
        ("edge", 1, -0.0),
        ("edge", 2, f32(1e-45)),
        ("edge", 3, f32(3.4028234663852886e38)),
        ("edge", 4, math.inf),
        ("edge", 5, -math.inf),
        ("edge", 6, math.nan),
        ("edge", 2**40, f32(0.1)),
    ]
)


def same_float32(got, want):
    """Bit-exact float32 equality; -0.0 differs from 0.0, NaN equals NaN."""
    if math.isnan(want):
        return math.isnan(got)
    return struct.pack("<f", got) == struct.pack("<f", want)


def write_sample(log_dir, run=None):
    args = [SAMPLE, str(log_dir)] + ([run] if run is not None else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_every_scalar_reads_back_exactly(tmp_path):
    path = write_sample(tmp_path)
    assert os.path.dirname(path) == str(tmp_path / "sample")
    assert os.path.basename(path).startswith("events.out.tfevents.")

    # size_guidance 0 keeps every event instead of a reservoir sample.
    acc = event_accumulator.EventAccumulator(
        str(tmp_path / "sample"), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    assert acc.file_version == 2.0  # "brain.Event:2"
    tags = sorted({tag for tag, _, _ in POINTS})
    assert sorted(acc.Tags()["scalars"]) == tags

    for tag in tags:
        want = [(i, p) for i, p in enumerate(POINTS) if p[0] == tag]
        got = acc.Scalars(tag)
        assert [e.step for e in got] == [p[1] for _, p in want], tag
        for event, (i, (_, step, value)) in zip(got, want):
            assert same_float32(event.value, value), (tag, step, event.value)
            assert event.wall_time == BASE_WALL_TIME + i, (tag, step)


def test_run_name_cannot_escape_log_dir(tmp_path):
    log_dir = tmp_path / "logs"
    done = subprocess.run([SAMPLE, str(log_dir), "../escape"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "tensorboard run" in done.stderr, done
    assert os.listdir(tmp_path) == []


def test_a_slash_in_a_run_name_is_a_run_of_that_name(tmp_path):
    log_dir = tmp_path / "logs"
    write_sample(log_dir, "exp/seed_1")
    write_sample(log_dir, "exp_seed_1")

    mux = event_multiplexer.EventMultiplexer(
        size_guidance={event_accumulator.SCALARS: 0}
    )
    mux.AddRunsFromDirectory(str(log_dir))
    mux.Reload()
    assert sorted(mux.Runs()) == ["exp/seed_1", "exp_seed_1"]
    got = mux.Scalars("exp/seed_1", "loss/kl")
    assert [e.step for e in got] == list(range(10))
