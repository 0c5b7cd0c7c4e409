"""``python -m healer`` is the same as the ``healer`` console script."""

import healer.cli

raise SystemExit(healer.cli.main())
