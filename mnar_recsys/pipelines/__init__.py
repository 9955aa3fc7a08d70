"""End-to-end pipelines behind the command line: data -> model -> evaluation -> results files."""
