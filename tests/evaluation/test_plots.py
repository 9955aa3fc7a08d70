"""The PNG figures: written whole, and refused when there is nothing to draw."""

import matplotlib.image
import pytest

from mnar_recsys.evaluation import plots


def curve_record(model, seed, best):
    bound = [(i, -200.0 + i / 10) for i in range(100, 1001, 100)]
    held_out = [(i, -150.0 - abs(i - best) / 50) for i in range(250, 1001, 250)]
    return {"model": model, "seed": seed, "training_curve": {"bound": bound, "validation": held_out},
            "best_iteration": best}


def test_training_curves_draw_one_panel_per_model(tmp_path):
    records = [curve_record("notmiwae-gaussian", 0, 500), curve_record("notmiwae-gaussian", 1, 750),
               curve_record("miwae-gaussian", 0, 250), {"model": "mf", "seed": 0}]
    path = plots.training_curves(records, tmp_path / "curves.png", title="test")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]  # no temporary file left
    height, width, _ = matplotlib.image.imread(path).shape
    # two 4.5 x 3.2 inch panels side by side (one would be 1.4 times as wide as high, three 4.2): the
    # baseline without a curve gets none
    assert 2.5 < width / height < 3.1


def test_rmse_by_dataset_draws_one_panel_per_data_set(tmp_path):
    records = [{"dataset": dataset, "model": model, "rmse": rmse + 0.01 * run}
               for dataset in ("banknote", "yeast") for model, rmse in (("notmiwae-agnostic", 0.7), ("mean", 1.7))
               for run in range(3)]
    path = plots.rmse_by_dataset(records, {"notmiwae-agnostic": {"banknote": 0.80}}, tmp_path / "rmse.png")
    height, width, _ = matplotlib.image.imread(path).shape
    # two 4.2 x 1.9 inch panels side by side, trimmed to their contents (one would be about 2.5 times as wide
    # as high, three about 7.6)
    assert 3.5 < width / height < 6


def test_figures_refuse_empty_input(tmp_path):
    with pytest.raises(ValueError, match="training curve"):
        plots.training_curves([{"model": "mf", "seed": 0}], tmp_path / "curves.png")
    with pytest.raises(ValueError, match="no predictions"):
        plots.prediction_histograms({}, [1, 2], tmp_path / "histogram.png")
    with pytest.raises(ValueError, match="no records"):
        plots.per_rating_mse([], tmp_path / "mse.png")
    with pytest.raises(ValueError, match="no records"):
        plots.rmse_by_dataset([], {}, tmp_path / "rmse.png")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plots would save, kept instead of written."""
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: figures.append(figure) or path)
    return figures


def test_the_bars_are_the_means_over_runs_and_seeds(drawn):
    plots.rmse_by_dataset([{"dataset": "yeast", "model": "mean", "rmse": value} for value in (0.5, 0.7, 0.9)], {},
                          "rmse.png")
    assert [bar.get_width() for bar in drawn[0].axes[0].patches] == [pytest.approx(0.7)]
    plots.per_rating_mse([{"model": "mf", "per_rating": {1: {"mse": 1.0}, 5: {"mse": 3.0}}},
                          {"model": "mf", "per_rating": {1: {"mse": 2.0}, 5: {"mse": 5.0}}}], "mse.png")
    assert [bar.get_height() for bar in drawn[1].axes[0].patches] == [pytest.approx(1.5), pytest.approx(4.0)]
