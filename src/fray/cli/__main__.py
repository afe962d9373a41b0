"""``python -m fray.cli``: the ``fray`` command."""

from fray.cli import main

if __name__ == "__main__":
    main()
