"""`python -m approxdist` runs the command-line tool."""

from approxdist.cli.main import main

raise SystemExit(main())
