"""Yahoo! R3 (Webscope "Yahoo! Music ratings for User Selected and Randomly Selected songs").

Not redistributable: users request it from Yahoo Webscope and point the loader at their own copy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .files import check_sha256, require_file
from .ratings import RatingsData
from .triples import Triples, read_triples, to_csr

CARD = "datasets/yahoo_r3/README.md"
TRAIN_FILE = "ydata-ymusic-rating-study-v1_0-train.txt"
TEST_FILE = "ydata-ymusic-rating-study-v1_0-test.txt"
SHA256 = {
    TRAIN_FILE: "838272034333a3448705dba4c3d563bd11d6c215518998d8de78c76b1f93bdc2",
    TEST_FILE: "d456af676c5fdc93587c0a386e840267112b721941febcea65f34c8933f91481",
}
RATING_SCALE = (1, 5)
SHAPE = (15_400, 1_000)  # users x songs of the published files; the ids run 1..15,400 and 1..1,000


def load_yahoo_r3(data_dir: str | Path) -> RatingsData:
    """Load Yahoo! R3 from ``data_dir``: self-selected train ratings and random (MCAR) test ratings.

    Files are ``user<TAB>song<TAB>rating`` lines with 1-based ids; id i becomes row/column i-1 and the
    shape is the train file's largest user and song ids (15,400 x 1,000 for the published files).
    Warns (``ChecksumWarning``) when a file's sha256 differs from the published one; raises
    FileNotFoundError for a missing file and ValueError, naming file and line, for malformed rows,
    ids outside 1..15,400 (users) or 1..1,000 (songs), or a test user or song with no train rating.
    """
    data_dir = Path(data_dir)
    paths = {f: require_file(data_dir / f, CARD) for f in (TRAIN_FILE, TEST_FILE)}
    digests = {}
    for f, path in paths.items():  # a loop, not a comprehension, so that a warning points at the caller
        digests[f] = check_sha256(path, SHA256[f], CARD)
    train, test = (
        read_triples(paths[f], sep="\t", header=False, rating_scale=RATING_SCALE, integer_ids=True)
        for f in (TRAIN_FILE, TEST_FILE)
    )
    for t in (train, test):
        _check_ids(t)
    shape = (int(train.users.max()), int(train.items.max()))
    _check_known(test, train)
    return RatingsData(
        name="yahoo_r3",
        train=to_csr(train.users - 1, train.items - 1, train.ratings, shape),
        test=to_csr(test.users - 1, test.items - 1, test.ratings, shape),
        rating_scale=RATING_SCALE,
        user_ids=np.arange(1, shape[0] + 1),
        item_ids=np.arange(1, shape[1] + 1),
        meta={"data_dir": str(data_dir), "sha256": digests, "card": CARD},
    )


def _check_ids(t: Triples) -> None:
    """Ids are positions: one far beyond the published range would size the matrix by it, so it is refused."""
    for kind, ids, n in (("user", t.users, SHAPE[0]), ("song", t.items, SHAPE[1])):
        bad = np.flatnonzero(ids < 1)
        if len(bad):
            raise t.error(bad[0], f"{kind} id {ids[bad[0]]} is not a 1-based id (expected >= 1)")
        bad = np.flatnonzero(ids > n)
        if len(bad):
            raise t.error(bad[0], f"{kind} id {ids[bad[0]]} is beyond Yahoo! R3's {kind}s (expected 1..{n:,}); "
                                  "load other (user, item, rating) files with load_triples")


def _check_known(test: Triples, train: Triples) -> None:
    """Every test user and song must have train ratings, as the published files' do: a model has learnt
    nothing of the others, and their MCAR scores would measure the prior."""
    for kind, ids, known in (("user", test.users, train.users), ("song", test.items, train.items)):
        bad = np.flatnonzero(~np.isin(ids, known))
        if len(bad):
            raise test.error(bad[0], f"{kind} id {ids[bad[0]]} is unknown to the train data "
                                     f"(no rating in {train.source})")
