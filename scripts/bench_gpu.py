#!/usr/bin/env python
"""Train a small Keras U-Net fed by (a) raw-PNG tf.data, (b) imgshard compact mode with
device-side expansion, (b2) the same with device-side augmentation (flip, scale, crop,
colour jitter: `readers.device.augment_batch`), (c) one batch held in device memory; report step time,
samples/s and the fraction of time spent waiting for input.

    python scripts/bench_gpu.py                      # 512x512, 50 steps (meant for a GPU)
    python scripts/bench_gpu.py --quick              # CPU smoke test: 64x64, 3 steps

See converter/bench/train.py and docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    from converter.bench.options import BenchOptions, quick_options
    from converter.options import parse_size

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", help="CamVid-layout source folder (default: generated 1920x1080 pairs, cached)")
    p.add_argument("--samples", type=int, default=150, help="generated pairs (default 150)")
    p.add_argument("--size", default="512x512", help="training size HxW (default 512x512)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=50, help="timed steps per feed (default 50)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--filters", type=int, default=16, help="filters of the first U-Net level (default 16)")
    p.add_argument("--depth", type=int, default=3, help="U-Net levels (default 3)")
    p.add_argument("--cache", help="folder for generated sources (default ~/.cache/imgshard)")
    p.add_argument("--json", help="also write the numbers here")
    p.add_argument("--quick", action="store_true", help="smoke test: 24 tiny pairs, 64x64, 3 steps, tiny U-Net")
    p.add_argument("--backend", choices=("auto", "tensorflow", "jax"), default="auto",
                   help="tensorflow: tf.data feeds and tf.function steps (converter/bench/train.py); jax: "
                        "keras_dataset feeds and a jitted step on Keras' JAX backend (converter/bench/train_jax.py), "
                        "for machines without TensorFlow; auto: tensorflow when it imports (default)")
    p.add_argument("--workers", type=int, default=4, help="PyDataset worker threads of the jax feeds (default 4)")
    args = p.parse_args(argv)
    backend = args.backend
    if backend == "auto":
        import importlib.util

        backend = "tensorflow" if importlib.util.find_spec("tensorflow") is not None else "jax"
    if backend == "jax":
        os.environ["KERAS_BACKEND"] = "jax"

    fields = {"src": args.src, "batch_size": args.batch_size}
    if args.cache:
        fields["cache"] = args.cache
    if args.quick:
        opts = quick_options(**fields)
        steps, warmup, filters, depth = min(args.steps, 3), 1, 4, 2
    else:
        opts = BenchOptions(samples=args.samples, size=parse_size(args.size), **fields)
        steps, warmup, filters, depth = args.steps, args.warmup, args.filters, args.depth

    from converter.bench.sources import prepare_sources, run_convert
    from converter.bench.train import format_train, run_train_bench

    sources = prepare_sources(opts, workers=1 if opts.quick else None)
    work = tempfile.mkdtemp(prefix="imgshard-bench-gpu-")
    try:
        out_dir = os.path.join(work, "compact")
        run_convert(sources.root, out_dir, opts.size, workers=os.cpu_count() or 1)
        if backend == "jax":
            from converter.bench.train_jax import run_train_bench_jax

            out = run_train_bench_jax(out_dir, size=opts.size, batch_size=opts.batch_size, steps=steps,
                                      warmup=warmup, base_filters=filters, depth=depth, workers=args.workers)
        else:
            out = run_train_bench(sources.pairs, sources.colors, out_dir, size=opts.size, batch_size=opts.batch_size,
                                  steps=steps, warmup=warmup, base_filters=filters, depth=depth,
                                  shuffle_buffer=opts.shuffle_buffer)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(format_train(out))
    for name, why in out.get("not_measured", {}).items():
        print(f"not measured: {name}: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
