"""The command line and its commands, one module each (``python -m scissorhands``).

:mod:`.cli` parses and dispatches; :mod:`.replay` (with the trace harness of
:mod:`.harness` and :mod:`.traces`), :mod:`.evaluate`, :mod:`.generate`,
:mod:`.longctx`, :mod:`.report` and :mod:`.retrieval` (lm-eval's tasks, ``tasks``) are
the commands; :mod:`.paths` checks their paths.  The library (everything outside this
package) never imports it.
"""
