# Calls flake.nix's outputs with a stand-in nixpkgs input (the stub pkgs of
# ./pkgs.nix for every system) and returns what tests/ops/test_nix.py checks of
# nix/package.nix and of the flake, as JSON. Nothing is built.
{
  libPath ? "",
  pythonPackages ? "[]",
}:
let
  lib = if libPath == "" then import ./minimal-lib.nix else import (/. + libPath);
  pkgs = import ./pkgs.nix {
    inherit lib;
    pythonPackages = builtins.fromJSON pythonPackages;
  };
  flake = import ../../../flake.nix;
  outputs = flake.outputs {
    self = outputs;
    nixpkgs = {
      inherit lib;
      legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" ] (_: pkgs);
    };
  };
  describe = package: {
    inherit (package) name pyproject;
    buildSystem = map (p: p.pname) package.build-system;
    dependencies = builtins.sort builtins.lessThan (map (p: p.pname) package.dependencies);
    importsChecked = package.pythonImportsCheck;
    inherit (package.meta) mainProgram;
  };
in
{
  inputs = builtins.attrNames flake.inputs;
  systems = builtins.attrNames outputs.packages;
  package = describe outputs.packages.x86_64-linux.default;
  withoutExtras = describe (
    pkgs.callPackage ../../../nix/package.nix {
      withTui = false;
      withRedis = false;
      withEtcd = false;
      withPostgres = false;
    }
  );
  # A nixpkgs without etcd3gw: the etcd client is left out, not an error.
  withoutEtcd3gw = describe (
    pkgs.callPackage ../../../nix/package.nix {
      python3Packages = removeAttrs pkgs.python3Packages [ "etcd3gw" ];
    }
  );
  moduleIsNixModule = outputs.nixosModules.default == ../../../nix/module.nix;
  overlay = (outputs.overlays.default pkgs pkgs).hamsterbunker.name;
}
