"""The JVM clients tests/setup_jvm.sh puts in target/jvm/lib (the Java client and Kafka's
tools), and how to run one: `command(MAIN, *args)`, MAIN a class or a .java source file."""
import os
import shutil

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LIB = os.path.join(REPO, "target", "jvm", "lib")


def require():
    """Skips the test without a JDK (saying why); fails it when the JDK is there but
    tests/setup_jvm.sh has not copied the jars."""
    if shutil.which("java") is None:
        pytest.skip("no java on PATH (tests/setup_jvm.sh sets up the JVM clients where a JDK and Maven are)")
    assert os.path.isdir(LIB), f"{LIB} is missing: run tests/setup_jvm.sh"


def command(main, *args, jvm_args=()):
    return ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", *jvm_args, "-cp", os.path.join(LIB, "*"),
            main, *args]
