# The HamsterBunker application: the `hb` and `hb-tui` commands.
#
#   pkgs.callPackage ./nix/package.nix { }
#
# Needs nixpkgs 24.05 or later (the `pyproject` builder's build-system and
# dependencies). tests/ops/test_nix.py checks the dependencies against pyproject.toml.
{
  lib,
  python3Packages,
  # pyproject.toml's extras: hb-tui needs Textual, the redis://, etcd:// and
  # postgresql:// stores need their clients (etcd3gw where this nixpkgs has it).
  withTui ? true,
  withRedis ? true,
  withEtcd ? python3Packages ? etcd3gw,
  withPostgres ? true,
}:
let
  pyproject = builtins.fromTOML (builtins.readFile ../pyproject.toml);
  extras = {
    tui = [ python3Packages.textual ];
    redis = [ python3Packages.redis ];
    etcd = [ python3Packages.etcd3gw ];
    postgres = [ python3Packages.psycopg ];
  };
in
python3Packages.buildPythonApplication {
  pname = "hamsterbunker";
  inherit (pyproject.project) version;
  pyproject = true;

  # Only what the wheel is built from: a change to the tests or the docs
  # rebuilds nothing, and neither do stray bytecode files of a working tree.
  src =
    let
      packages = [
        ../hamsterbunker
        ../tui
      ];
      bytecode = map (lib.fileset.fileFilter (file: file.hasExt "pyc")) packages;
    in
    lib.fileset.toSource {
      root = ../.;
      fileset = lib.fileset.difference (lib.fileset.unions (
        [
          ../pyproject.toml
          ../README.md
        ]
        ++ packages
      )) (lib.fileset.unions bytecode);
    };

  build-system = [ python3Packages.setuptools ];

  dependencies =
    with python3Packages;
    [
      cryptography
      watchfiles
      asyncinotify
      sdnotify
      tomli-w
      prometheus-client
      orjson
    ]
    ++ lib.optionals withTui extras.tui
    ++ lib.optionals withRedis extras.redis
    ++ lib.optionals withEtcd extras.etcd
    ++ lib.optionals withPostgres extras.postgres;

  # The test suite runs real node processes, systemd and fault injection
  # (make test); the build only checks that the packages import.
  pythonImportsCheck = [ "hamsterbunker" ] ++ lib.optionals withTui [ "hamsterbunker_tui" ];

  meta = {
    description = "Keeps one long-running AI agent alive when the machine under it dies";
    homepage = "https://github.com/hamsterbunker/hamsterbunker";
    license = lib.licenses.mit;
    mainProgram = "hb";
    platforms = lib.platforms.linux;
  };
}
