"""Results files say which code made them: the commit, and whether tracked files had changed since."""

import subprocess

from mnar_recsys.io import git_state, provenance


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_state_sees_changes_to_tracked_files_but_not_untracked_ones(tmp_path):
    assert git_state(tmp_path) == (None, None)  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "model.py").write_text("K = 20\n")
    _git(tmp_path, "add", "model.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    (tmp_path / "results.json").write_text("{}")
    assert git_state(tmp_path) == (commit, False)
    (tmp_path / "model.py").write_text("K = 50\n")
    assert git_state(tmp_path) == (commit, True)
    # a folder inside the checkout (a package installed into a virtual environment there) is not its code
    (tmp_path / "venv" / "site-packages").mkdir(parents=True)
    assert git_state(tmp_path / "venv" / "site-packages") == (None, None)


def test_provenance_records_the_commit_and_whether_the_tree_was_clean():
    record = provenance()
    assert {"package_version", "commit", "dirty", "torch", "numpy", "scipy", "scikit-learn"} <= set(record)
    assert (record["commit"] is None) == (record["dirty"] is None)


def test_provenance_reports_the_package_checkouts_state(monkeypatch):
    """What git says of the folder holding the package, commit and dirty flag both, reaches the record."""
    from pathlib import Path

    import mnar_recsys
    from mnar_recsys import io as reports

    asked = []

    def state(root):
        asked.append(root)
        return "abc123", True

    monkeypatch.setattr(reports, "git_state", state)
    record = provenance()
    assert (record["commit"], record["dirty"]) == ("abc123", True)
    assert asked == [Path(mnar_recsys.__file__).resolve().parents[1]]
