"""The `pocketspec` command's entry point: it first starts the process again with huge pages for
llama.cpp's buffers where that helps (pocketspec/huge_pages.py), before the CLI's imports take
their second, then runs the CLI."""

import sys


def main() -> None:
    try:
        from pocketspec.huge_pages import restart_with_huge_pages

        restart_with_huge_pages()
    except KeyboardInterrupt:  # as apps/cli.py meets a Ctrl-C during its imports
        sys.stderr.write("\ninterrupted\n")
        sys.exit(130)
    from apps.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
