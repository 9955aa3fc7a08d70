"""The core models behind familiar interfaces: a fit / predict recommender and a scikit-learn imputer."""
