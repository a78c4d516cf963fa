# Evaluates nix/module.nix through lib.evalModules with the stand-ins beside it,
# plus a host module (the test's configuration), and returns what the tests
# compare as JSON (nix-instantiate --eval --strict --json).
#
#   nix-instantiate --eval --strict --json tests/ops/nix/eval.nix \
#     --arg host ./host.nix [--argstr libPath /path/to/nixpkgs/lib]
#
# Without libPath the minimal lib of tests/ops/nix/minimal-lib.nix is used.
{
  host,
  libPath ? "",
  pythonPackages ? "[]",
}:
let
  lib = if libPath == "" then import ./minimal-lib.nix else import (/. + libPath);
  pkgs = import ./pkgs.nix {
    inherit lib;
    pythonPackages = builtins.fromJSON pythonPackages;
  };
  evaluated = lib.evalModules {
    modules = [
      ../../../nix/module.nix
      ./nixos-stubs.nix
      host
    ];
    specialArgs = { inherit pkgs; };
  };
  config = evaluated.config;
in
{
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  services = builtins.mapAttrs (_: service: {
    inherit (service)
      description
      documentation
      wants
      after
      wantedBy
      unitConfig
      serviceConfig
      ;
    restartTriggers = map toString service.restartTriggers;
  }) config.systemd.services;
  users = config.users.users;
  groups = config.users.groups;
  etc = builtins.mapAttrs (_: file: {
    source = toString file.source;
    inherit (file.source) text;
  }) config.environment.etc;
  systemPackages = map (p: p.name) config.environment.systemPackages;
  package = {
    inherit (config.services.hamsterbunker.package) name;
    path = config.services.hamsterbunker.package.outPath;
  };
}
