"""Build of the klserve Python client.

The gRPC and protobuf stubs are not committed: they are generated here, with
grpcio-tools, from proto/klserve/v1/klserve.proto (two directories up, in the
repository; an sdist carries its own copy under proto/). `-I proto` makes the
generated modules klserve/v1/klserve_pb2.py and klserve_pb2_grpc.py, i.e. the
subpackage `klserve.v1` of this package, whose imports
(`from klserve.v1 import klserve_pb2`) then resolve as they are.

The generated code refuses protobuf / grpcio runtimes older than its
generator, so the runtime lower bounds are read off the stubs this
grpcio-tools generates, not written by hand.
"""

import os
import re
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_REL = os.path.join("klserve", "v1", "klserve.proto")
# The grpc.health.v1 stubs, as gRPC publishes them: grpcio-tools ships no
# health.proto to generate them from here.
HEALTH_STUBS = "grpcio-health-checking"


def proto_root():
    """The directory that holds klserve/v1/klserve.proto."""
    candidates = [
        os.environ.get("KLSERVE_PROTO_DIR", ""),
        os.path.join(HERE, "..", "..", "proto"),  # the repository
        os.path.join(HERE, "proto"),  # an sdist
    ]
    for root in candidates:
        if root and os.path.isfile(os.path.join(root, PROTO_REL)):
            return os.path.normpath(root)
    raise RuntimeError(
        "klserve: cannot find %s under %s (build from the repository's "
        "client/python, or set KLSERVE_PROTO_DIR)" % (PROTO_REL, candidates[1:])
    )


def generate_stubs(out_dir):
    """Writes klserve/v1/{__init__,klserve_pb2,klserve_pb2_grpc}.py(i) into
    out_dir; returns the paths written."""
    from grpc_tools import protoc

    root = proto_root()
    os.makedirs(out_dir, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        "-I" + root,
        "--python_out=" + out_dir,
        "--pyi_out=" + out_dir,
        "--grpc_python_out=" + out_dir,
        os.path.join(root, PROTO_REL),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("klserve: protoc failed on " + PROTO_REL)
    package_dir = os.path.join(out_dir, "klserve", "v1")
    init = os.path.join(package_dir, "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated from proto/klserve/v1/klserve.proto at build time."""\n')
    return [
        os.path.join(package_dir, name)
        for name in sorted(os.listdir(package_dir))
        if name.endswith((".py", ".pyi"))
    ]


def runtime_requirements():
    """grpcio and protobuf no older than what the generated stubs demand."""
    grpcio, protobuf = "grpcio", "protobuf"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            generate_stubs(tmp)
            package_dir = os.path.join(tmp, "klserve", "v1")
            with open(os.path.join(package_dir, "klserve_pb2.py")) as f:
                pb2 = f.read()
            with open(os.path.join(package_dir, "klserve_pb2_grpc.py")) as f:
                pb2_grpc = f.read()
    except Exception as e:  # metadata must not fail where stubs could not
        print("klserve: stub generation failed while reading versions:", e,
              file=sys.stderr)
        return ["grpcio", "protobuf", "numpy", "ml_dtypes",
                HEALTH_STUBS]
    m = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
        r"\s*(\d+),\s*(\d+),\s*(\d+)", pb2)
    if m:
        major, minor, patch = (int(x) for x in m.groups())
        protobuf = "protobuf>=%d.%d.%d,<%d" % (major, minor, patch, major + 1)
    m = re.search(r"GRPC_GENERATED_VERSION\s*=\s*'([0-9.]+)'", pb2_grpc)
    if m:
        grpcio = "grpcio>=" + m.group(1)
    return [grpcio, protobuf, "numpy", "ml_dtypes", HEALTH_STUBS]


class BuildPyWithStubs(build_py):
    """build_py, plus the stubs: into the build tree for a wheel, into the
    source tree (git-ignored) for an editable install."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            out = os.path.join(HERE, "src")
        else:
            out = self.build_lib
        self._stubs = generate_stubs(out)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + list(
            getattr(self, "_stubs", []))


class SdistWithProto(sdist):
    """An sdist carries the .proto, since it leaves the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, "proto", PROTO_REL)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(proto_root(), PROTO_REL), target)


setup(
    package_dir={"": "src"},
    packages=["klserve"],
    # PEP 561: the package's own type hints are for type checkers too.
    package_data={"klserve": ["py.typed"]},
    install_requires=runtime_requirements(),
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
)
