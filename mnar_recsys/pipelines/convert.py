"""`mnar-recsys convert-ratings`: a (user, item, rating) text file into an on-disk CSR folder to train from."""

from __future__ import annotations

import argparse

from mnar_recsys.data.ondisk import convert_triples, open_csr
from mnar_recsys.data.triples import check_rating_scale


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("convert-ratings", help="convert a (user, item, rating) file into a CSR folder "
                                                           "that training reads without loading it whole")
    parser.add_argument("input", help="text file with user, item, rating columns (header detected)")
    parser.add_argument("out_dir", help="folder to create (must not exist)")
    parser.add_argument("--sep", default=None,
                        help="field separator (default: the first of tab, comma, semicolon, bar on the first line, "
                             "else whitespace; a tab from a shell: $'\\t')")
    parser.add_argument("--rating-scale", type=rating_scale, default=(1, 5),
                        help="LOW,HIGH integer ratings (default 1,5)")
    parser.set_defaults(run=_run)


def rating_scale(text: str) -> tuple[int, int]:
    """LOW,HIGH as two integers 1 <= LOW < HIGH; argparse prints the error after the option's name."""
    try:
        low, high = (int(part) for part in text.split(","))
        check_rating_scale((low, high))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH: two integers 1 <= LOW < HIGH such as 1,5; got {text!r}") \
            from None
    return low, high


def _run(args: argparse.Namespace) -> int:
    rows = open_csr(convert_triples(args.input, args.out_dir, sep=args.sep, rating_scale=args.rating_scale))
    print(f"wrote {args.out_dir}: {rows.n_rows} users x {rows.n_features} items, {rows.nnz} ratings")
    return 0
