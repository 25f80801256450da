"""`imgshard bench`: the pipelines people use today against imgshard, side by side.

One run measures, on the same cores and data (see issues 4 and 19 and docs/PERFORMANCE.md):

1. `tf.data` over raw PNGs (decode, resize, per-colour `tf.equal` one-hot);
2. a Keras `PyDataset` over raw PNGs with worker processes;
3. `tf.data.Dataset.save` / `load` of the stored uint8 tensors, read back as a TF user
   writes it (`load().repeat().shuffle().batch().map(to_float_and_one_hot, AUTOTUNE)
   .prefetch()`; float32 + one-hot, float32 + sparse labels, compact);
4. the imgshard TFRecord reader delivering float32 + one-hot, and float32 + sparse labels;
5. the imgshard reader in compact mode (uint8 image + class map), also followed by the
   device-side expansion (`readers.device.expand_batch`);
6. the imgshard NPZ reader (compressed and stored) against a one-process `np.load` loop;
7. conversion: the decode-only floor, the bare transform, a naive Pillow loop, and
   `imgshard convert` with 1..cores workers, 3 interleaved runs;
8. training-time augmentation (issue 15);
9. peak RSS of the converter (and its growth from 200 to 2,000 samples) and the reader.

Reader rows run in interleaved rounds, the first (warm-up) dropped (`rounds`); each is
set against the host's copy bandwidth, probed in a fresh process (`bandwidth`):
limit = 2 x bandwidth / (bytes read + written per sample). `markdown` turns the JSON
into the README's and docs/PERFORMANCE.md's tables (`scripts/bench_docs.py`).

    from converter.bench import BenchOptions, run_bench
    from converter.bench.report import table
    result = run_bench(BenchOptions())
    print(table(result))

The TensorFlow, Keras and Pillow imports happen inside the functions that need them.
"""

from converter.bench.options import BenchOptions, quick_options
from converter.bench.result import BenchResult
from converter.bench.suite import run_bench

__all__ = ["BenchOptions", "BenchResult", "quick_options", "run_bench"]
