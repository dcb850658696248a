"""The vectors' scenarios, one module per policy and per concern shared by the
policies; ``vectors/generate.py`` lists them, checks them on the reference and writes
the files."""
