# Stand-ins for the NixOS option declarations nix/module.nix defines into:
# systemd.services (with NixOS's merge of unit settings), users, environment
# and assertions. Nothing else is declared, so a module that set anything else
# (a firewall port, a tmpfiles rule, ...) would fail to evaluate.
{ lib, ... }:
let
  inherit (lib) mkOption types;

  # NixOS's unitOption (nixos/lib/systemd-unit-options.nix): definitions of a
  # repeatable setting (lists) add up; any other setting takes one agreed value.
  unitOption = types.mkOptionType {
    name = "systemd option";
    merge =
      loc: defs:
      let
        winners = lib.filterOverrides defs;
      in
      if builtins.isList (builtins.head winners).value then
        builtins.concatMap (def: def.value) winners
      else
        lib.mergeEqualOption loc winners;
  };

  unitNames = mkOption {
    type = types.listOf types.str;
    default = [ ];
  };

  service = types.submodule {
    options = {
      description = mkOption {
        type = types.str;
        default = "";
      };
      documentation = unitNames;
      wants = unitNames;
      after = unitNames;
      wantedBy = unitNames;
      restartTriggers = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      unitConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
      serviceConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
    };
  };

  attrsOfAttrs = mkOption {
    type = types.attrsOf (types.attrsOf types.unspecified);
    default = { };
  };
in
{
  options = {
    assertions = mkOption {
      type = types.listOf types.unspecified;
      default = [ ];
    };
    systemd.services = mkOption {
      type = types.attrsOf service;
      default = { };
    };
    users.users = attrsOfAttrs;
    users.groups = attrsOfAttrs;
    environment.etc = attrsOfAttrs;
    environment.systemPackages = mkOption {
      type = types.listOf types.package;
      default = [ ];
    };
  };
}
