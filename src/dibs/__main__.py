"""``python -m dibs`` is the ``dibs`` command."""

from dibs.cli import main

raise SystemExit(main())
