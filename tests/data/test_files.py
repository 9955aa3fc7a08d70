"""Shared file checks: a compressed file read as text is named as compressed, not as text to re-save."""

import bz2
import gzip

import pytest

from mnar_recsys.data.ondisk import convert_triples
from mnar_recsys.data.triples import read_triples


@pytest.mark.parametrize("kind, compress", [("gzip", gzip.compress), ("bzip2", bz2.compress)])
def test_a_compressed_file_is_named_as_compressed(tmp_path, kind, compress):
    path = tmp_path / "r.csv"
    path.write_bytes(compress(b"u1,i1,4\nu2,i1,3\n" * 50))
    message = rf"r\.csv is {kind}-compressed, not text; decompress it first"
    with pytest.raises(ValueError, match=message):
        read_triples(path)
    with pytest.raises(ValueError, match=message):
        convert_triples(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
