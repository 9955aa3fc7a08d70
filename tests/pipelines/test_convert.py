"""`convert-ratings` options: a --rating-scale that is not LOW,HIGH is refused naming the option and the form."""

import pytest

from mnar_recsys.cli import main


@pytest.mark.parametrize("scale", ["a,b", "5,1", "0,5", "1,2,3", "3"])
def test_a_rating_scale_that_is_not_low_high_is_refused(tmp_path, capsys, scale):
    source = tmp_path / "r.csv"
    source.write_text("u1,i1,4\n")
    with pytest.raises(SystemExit) as stopped:
        main(["convert-ratings", str(source), str(tmp_path / "out"), "--rating-scale", scale])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert ("argument --rating-scale: expected LOW,HIGH: two integers 1 <= LOW < HIGH such as 1,5; "
            f"got {scale!r}") in error
    assert not (tmp_path / "out").exists()
