import sys


def run() -> None:
    """Console entry: answer --version before importing typer/rich (scripts probe it often)."""
    if sys.argv[1:] == ["--version"]:
        from . import __version__
        print(f"ckptdoctor {__version__}")
        sys.exit(0)
    from .cli import main
    main()


if __name__ == "__main__":
    run()
