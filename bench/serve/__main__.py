"""`python -m bench.serve`: the same as `pdrelay bench serve`."""

from bench.serve.main import main

raise SystemExit(main())
