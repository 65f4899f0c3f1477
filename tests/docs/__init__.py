"""Every code block of the README and ``docs/`` is a test, so the docs cannot drift from the code.

Sybil (https://sybil.readthedocs.io) finds the fenced blocks of the Markdown files listed in
:mod:`tests.docs.plugin`, which the repository's root ``conftest.py`` loads and ``testpaths`` points
pytest at, so ``scripts/test`` runs them with the rest (``scripts/test README.md docs
prefect_integration/README.md`` runs only them). How each kind of block is run:

- ``python`` blocks are executed for real, one namespace per document, in order
  (:class:`~tests.docs.evaluators.PythonSnippet`). What a block needs but does not show (a function
  it calls, a check of what it did) is an *invisible* block in the Markdown
  (``<!-- invisible-code-block: python ... -->``), with the helper ``docs``
  (:class:`~tests.docs.context.DocContext`) in its namespace.
- ``bash`` blocks run in ``bash``, one command after the other, in a temporary directory with
  ``DIBS_STORE_URL`` on a temporary SQLite store; each command must exit 0 unless its comment says
  ``exits N`` (:class:`~tests.docs.evaluators.ShellSnippet`).
- Blocks that cannot run inside the suite (installs, the suite itself, CI) are preceded by
  ``<!-- skip: next "why, and what runs it instead" -->``: the reason shows in the test report.
- ``text`` blocks (output samples) are not run; an invisible block after one may check it against
  what the code produces (``docs.previous_block()``).

Addresses in the docs name deployments (``postgresql+psycopg://etl@db/dibs``, a Prefect server on
port 4200): :mod:`tests.docs.substitutions` says which the tests replace, with what, and why.
"""
