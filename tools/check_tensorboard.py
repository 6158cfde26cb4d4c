#!/usr/bin/env python3
"""Checks TensorBoard event files (e.g. from ampgrad::utils::SummaryWriter) with TensorBoard's own code.

Usage: tools/check_tensorboard.py LOGDIR [--expect-tag TAG ...]

Every event file under LOGDIR is read record by record with TensorBoard's reader, which verifies both
CRCs of each record, and must start with a file_version "brain.Event:2" event. Each folder holding event
files (a run) is then loaded with TensorBoard's EventAccumulator, and its scalars and histograms are
printed. Exit status 1 when a file is corrupt, no event file is found, or an expected tag is missing.
When the `tensorboard` Python package cannot be imported, it prints why it skipped and exits 0.
"""
import argparse
import math
import os
import sys


def event_files(logdir):
    for folder, _, names in sorted(os.walk(logdir)):
        for name in sorted(names):
            if "tfevents" in name:
                yield os.path.join(folder, name)


def strict_records(path, pywrap_tensorflow, errors):
    """Yields each record's payload; raises errors.DataLossError on a CRC mismatch or truncation."""
    reader = pywrap_tensorflow.PyRecordReader_New(path, 0, None, None)
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return
        yield reader.record()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--expect-tag", action="append", default=[], help="a tag that must be present")
    args = parser.parse_args()

    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
    except ImportError as e:
        print(f"check_tensorboard: skipped: the tensorboard package is not importable ({e}); "
              "`pip install tensorboard` (in a virtual environment) to run this check")
        return 0

    files = list(event_files(args.logdir))
    if not files:
        print(f"check_tensorboard: no event files under {args.logdir}")
        return 1
    failures = 0
    for path in files:
        try:
            events = [event_pb2.Event.FromString(r) for r in strict_records(path, pywrap_tensorflow, errors)]
        except errors.DataLossError as e:
            print(f"FAIL {path}: {e.message}")
            failures += 1
            continue
        if not events or events[0].file_version != "brain.Event:2":
            print(f"FAIL {path}: the first event is not file_version brain.Event:2")
            failures += 1
            continue
        print(f"ok   {path}: {len(events)} events, CRCs verified")

    seen_tags = set()
    for run in sorted({os.path.dirname(p) for p in files}):
        acc = event_accumulator.EventAccumulator(
            run, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
        acc.Reload()
        tags = acc.Tags()
        print(f"run {os.path.relpath(run, args.logdir)}:")
        for tag in tags.get(event_accumulator.SCALARS, []):
            points = acc.Scalars(tag)
            seen_tags.add(tag)
            nonfinite = sum(not math.isfinite(p.value) for p in points)
            print(f"  scalar {tag}: {len(points)} points, steps {points[0].step}..{points[-1].step}, "
                  f"first {points[0].value:.6g}, last {points[-1].value:.6g}"
                  + (f", {nonfinite} inf/NaN" if nonfinite else ""))
        for tag in tags.get(event_accumulator.HISTOGRAMS, []):
            hists = acc.Histograms(tag)
            seen_tags.add(tag)
            h = hists[-1].histogram_value
            counted = sum(h.bucket)
            print(f"  histogram {tag}: {len(hists)} steps; last: num {h.num:g}, min {h.min:.6g}, max {h.max:.6g}, "
                  f"{len(h.bucket)} buckets holding {counted:g}")
            if counted != h.num:
                print(f"FAIL histogram {tag}: buckets hold {counted:g} values but num is {h.num:g}")
                failures += 1
    for tag in args.expect_tag:
        if tag not in seen_tags:
            print(f"FAIL expected tag {tag!r} not found (found: {sorted(seen_tags)})")
            failures += 1
    print("check_tensorboard: " + ("all good" if failures == 0 else f"{failures} problem(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
