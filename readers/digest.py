"""Content digests ("ALGORITHM:HEX"): the one implementation the converter (source and
shard fingerprints) and the readers (index files, bucket objects, the local cache) share.

xxh3-128 (`xxhash`) since manifest version 2, sha256 in version 1; a digest names its
algorithm, so content is always compared with the algorithm its old digest used. The
hash libraries are imported when a digest is first computed (the readers import with
NumPy only).
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

DEFAULT_ALGORITHM = "xxh3_128"
#: Content digests a manifest may name.
DIGEST_ALGORITHMS = ("xxh3_128", "sha256")
CHUNK_BYTES = 1 << 20


def new_hasher(algorithm: str = DEFAULT_ALGORITHM) -> Any:
    """A hashlib-style object (update / hexdigest) for `algorithm`."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"algorithm must be one of {sorted(DIGEST_ALGORITHMS)}. Received: {algorithm!r}")


def algorithm_of(digest: str) -> str:
    """The algorithm a "ALGORITHM:HEX" digest names; ValueError for anything else."""
    algorithm = digest.split(":", 1)[0]
    if algorithm not in DIGEST_ALGORITHMS or ":" not in digest:
        raise ValueError(f"digest must look like 'ALGORITHM:HEX' with ALGORITHM one of {sorted(DIGEST_ALGORITHMS)}. "
                         f"Received: {digest!r}")
    return algorithm


def digest_bytes(data: Any, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """'ALGORITHM:HEX' of `data`."""
    h = new_hasher(algorithm)
    h.update(data)
    return f"{algorithm}:{h.hexdigest()}"


def digest_stream(f: IO[bytes], algorithm: str = DEFAULT_ALGORITHM, chunk: int = CHUNK_BYTES) -> str:
    """'ALGORITHM:HEX' of everything left in the binary file `f`, read in `chunk`-byte pieces."""
    h = new_hasher(algorithm)
    while piece := f.read(chunk):
        h.update(piece)
    return f"{algorithm}:{h.hexdigest()}"


def hex_of(h: Any, algorithm: str) -> str:
    """'ALGORITHM:HEX' of a hasher `new_hasher(algorithm)` returned, after its updates."""
    return f"{algorithm}:{h.hexdigest()}"


__all__ = ["CHUNK_BYTES", "DEFAULT_ALGORITHM", "DIGEST_ALGORITHMS", "algorithm_of", "digest_bytes", "digest_stream",
           "hex_of", "new_hasher"]
