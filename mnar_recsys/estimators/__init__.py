"""Recommenders: the core models behind the cornac-style fit(train) / predict(users, items) interface."""
