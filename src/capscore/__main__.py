"""``python -m capscore``: the ``capscore`` command (the same as the console script)."""
from capscore.cli import entry

if __name__ == "__main__":
    entry()
