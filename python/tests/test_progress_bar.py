"""stream()'s progress bar: drawn on stderr when it is a terminal (a real
pseudo-terminal here), with the records read of the file's size, the rate
and the time left; never when stderr is a pipe or progress=False. The
result is the same either way, and equals DuckDB's over the same rows."""
import os
import pty
import subprocess
import sys

from conftest import events, write_jsonl

SCRIPT = """
import sys, ubik
t = ubik.stream("SELECT merchant, count(*) AS n FROM orders GROUP BY merchant",
                from_="file://" + sys.argv[1], schema="merchant VARCHAR, ts TIMESTAMP, amount DOUBLE",
                table="orders", **eval(sys.argv[2])).arrow()
print(sorted(zip(t.column("merchant").to_pylist(), t.column("n").to_pylist())))
"""


def run(path, options, terminal):
    """Runs SCRIPT with stderr on a pseudo-terminal (or a pipe); returns (stdout, stderr)."""
    if terminal:
        master, slave = pty.openpty()
        p = subprocess.Popen([sys.executable, "-c", SCRIPT, path, options], stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            err += chunk
        os.close(master)
        out = p.stdout.read()
        assert p.wait(timeout=120) == 0, err.decode(errors="replace")
        return out.decode(), err.decode(errors="replace")
    p = subprocess.run([sys.executable, "-c", SCRIPT, path, options], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode(), p.stderr.decode()


def test_a_terminal_gets_a_bar_toward_the_file_size_and_a_pipe_does_not(tmp_path):
    import duckdb
    path = write_jsonl(tmp_path / "orders.jsonl", events(200_000, keys=7))
    want = duckdb.sql(f"SELECT merchant, count(*) FROM read_json_auto('{path}') GROUP BY merchant").fetchall()
    want = str(sorted((m, n) for m, n in want))

    out, err = run(str(path), "{}", terminal=True)
    assert out.strip() == want
    # The bar reached the whole file, with the rate and the time left.
    assert "100% ETA" in err and "records (" in err and "/s)" in err, err[-2000:]
    assert "[" + "=" * 30 + "]" in err, err[-2000:]

    out, err = run(str(path), "{'progress': False}", terminal=True)
    assert out.strip() == want
    assert "ETA" not in err, err[-2000:]

    out, err = run(str(path), "{}", terminal=False)
    assert out.strip() == want
    assert "ETA" not in err and "\r" not in err, err[-2000:]
