import sys


def run() -> None:
    """Console entry: answer --version before importing typer/rich (scripts probe it often).

    Ctrl-C at any moment is one line and exit 130: while the modules load (before any command's own
    handler exists) as while a command runs; once the verdict is out, a late Ctrl-C no longer changes
    how the process ends (it would otherwise die by the signal, not with the verdict's status)."""
    try:
        if sys.argv[1:] == ["--version"]:
            from . import __version__
            print(f"ckptdoctor {__version__}")
            sys.exit(0)
        from .cli import main
        main()
        code = 0
    except KeyboardInterrupt:
        sys.stderr.write("ckptdoctor: interrupted\n")
        code = 130
    except SystemExit as exc:
        code = exc.code
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    run()
