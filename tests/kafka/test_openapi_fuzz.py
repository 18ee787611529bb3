"""The admin API fuzzed from its own OpenAPI document with schemathesis: every check
(no server error; status codes, content types and bodies as documented; requests the
document calls invalid refused; requests it calls valid accepted), in all four
phases (examples, coverage, fuzzing, stateful). What the document cannot state (rules
that depend on values or on the cluster's state) is listed, with why, in
fuzz/schemathesis.toml. Zero failures.

CI runs a fixed seed with 25 examples per operation (about a minute); more by hand:
STROM_FUZZ_EXAMPLES=500 STROM_FUZZ_SEED=7 target/pyenv/bin/python -m pytest tests/kafka/test_openapi_fuzz.py"""
import os
import re
import subprocess
import sys

CONFIG = os.path.join(os.path.dirname(__file__), "fuzz", "schemathesis.toml")
METHODS = {"get", "put", "post", "delete", "patch"}


def test_the_admin_api_is_what_its_openapi_document_says(make_cluster, tmp_path):
    cluster = make_cluster(1)
    status, spec = cluster.get(1, "/v1/openapi.json")
    assert status == 200
    # (schemathesis leaves out the document's own path)
    operations = sum(1 for path, item in spec["paths"].items() for method in item
                     if method in METHODS and path != "/v1/openapi.json")
    st = os.path.join(os.path.dirname(sys.executable), "st")
    examples = os.environ.get("STROM_FUZZ_EXAMPLES", "25")
    seed = os.environ.get("STROM_FUZZ_SEED", "1")
    url = f"http://{cluster.nodes[1].admin}/v1/openapi.json"
    out = subprocess.run(
        [st, "--config-file", CONFIG, "--no-color", "run", url, "--checks", "all", "--max-examples", examples,
         "--seed", seed, "--request-timeout", "20", "--generation-database", "none"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"schemathesis found failures (seed {seed}):\n{text[-12000:]}"
    # Every operation of the document was selected, passed the coverage and fuzzing
    # phases, and many cases were generated.
    selected = re.search(r"Operations:\s+(\d+) selected / (\d+) total", text)
    coverage = re.search(r"Coverage \(in [^)]*\)\s+✅ (\d+) passed", text)
    fuzzing = re.search(r"Fuzzing \(in [^)]*\)\s+✅ (\d+) passed", text)
    generated = re.search(r"(\d+) generated", text)
    assert selected and coverage and fuzzing and generated, text
    assert int(selected.group(1)) == int(selected.group(2)) == operations, text
    assert int(coverage.group(1)) == int(fuzzing.group(1)) == operations, text
    assert int(generated.group(1)) > 20 * operations, text
