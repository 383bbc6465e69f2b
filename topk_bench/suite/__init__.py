"""Suites: a TOML experiment read, checked and expanded into cases; and bench.toml, the project's defaults.

``files`` reads TOML and turns schema errors into one-line bad input;
``settings`` is bench.toml; ``schema`` a suite's keys and types; ``checks``
what a suite means against the workloads and implementations; ``sweep`` the
suite expanded into cases; ``load`` all of it for one file.
"""
