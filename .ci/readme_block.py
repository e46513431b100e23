"""Print the README's install block: the fenced block right after the line
`<!-- install: .ci/run runs this block as written -->`. Exits 1 if there is none.
tests/test_docs.py checks that the block ends with the test command the README shows."""
import sys
from pathlib import Path

MARKER = "<!-- install: .ci/run runs this block as written -->"


def install_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(MARKER) + 1
    if not lines[start].startswith("```"):
        raise ValueError("the install marker is not followed by a fenced block")
    end = lines.index("```", start + 1)
    return lines[start + 1:end]


if __name__ == "__main__":
    text = Path(sys.argv[1]).read_text()
    try:
        block = install_block(text)
    except ValueError as e:
        sys.exit(f"README: {e}")
    print("\n".join(block))
