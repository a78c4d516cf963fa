# The module-system behaviour nix/module.nix and the stubs rely on, as small
# cases. tests/ops/test_nix.py pins their results, so the minimal lib and the real
# nixpkgs lib (HB_NIXPKGS_LIB) must both give them.
{ libPath ? "" }:
let
  lib = if libPath == "" then import ./minimal-lib.nix else import (/. + libPath);
  inherit (lib) mkOption types;

  eval = modules: (lib.evalModules { inherit modules; }).config;
  # Whether evaluating (deeply) fails with an error the module system throws.
  fails = value: !(builtins.tryEval (builtins.deepSeq value value)).success;

  settingOption = mkOption {
    type = types.attrsOf (
      types.mkOptionType {
        name = "setting";
        merge =
          loc: defs:
          let
            winners = lib.filterOverrides defs;
          in
          if builtins.isList (builtins.head winners).value then
            builtins.concatMap (def: def.value) winners
          else
            lib.mergeEqualOption loc winners;
      }
    );
    default = { };
  };

  agents = {
    options.agents = mkOption {
      default = { };
      type = types.attrsOf (
        types.submodule (
          { name, ... }:
          {
            options.enable = lib.mkEnableOption "it";
            options.label = mkOption {
              type = types.str;
              default = "agent ${name}";
            };
            options.count = mkOption {
              type = types.nullOr types.ints.positive;
              default = null;
            };
          }
        )
      );
    };
  };
in
{
  defaultLosesToPlain = (eval [
    { options.a = mkOption { type = types.str; }; }
    { a = lib.mkDefault "default"; }
    { a = "plain"; }
  ]).a;

  forceBeatsPlain = (eval [
    { options.a = mkOption { type = types.int; default = 1; }; }
    { a = 2; }
    { a = lib.mkForce 3; }
  ]).a;

  optionDefaultLosesToMkDefault = (eval [
    { options.a = mkOption { type = types.int; default = 1; }; }
    { a = lib.mkDefault 2; }
  ]).a;

  ifFalseDropsEntry = eval [
    { options.s = settingOption; }
    {
      s = lib.mkMerge [
        { kept = "yes"; }
        (lib.mkIf false { dropped = "no"; })
      ];
    }
  ];

  listsAddUp = (eval [
    { options.s = settingOption; }
    { s.L = [ "a" ]; }
    { s.L = [ "b" ]; }
  ]).s.L;

  defaultListReplaced = (eval [
    { options.s = settingOption; }
    { s.L = lib.mkDefault [ "a" ]; }
    { s.L = [ "b" ]; }
  ]).s.L;

  submoduleListsAddUp = (eval [
    {
      options.units = mkOption {
        type = types.attrsOf (types.submodule { options.s = settingOption; });
      };
    }
    { units.u.s.L = [ "module" ]; }
    { units.u.s.L = [ "host" ]; }
    { units.u.s.M = lib.mkDefault [ "default" ]; }
    { units.u.s.M = [ "host" ]; }
  ]).units.u.s;

  submoduleNamesAndDefaults = (eval [
    agents
    { agents.x.enable = true; }
    { agents.x.count = 3; agents.y = { }; }
  ]).agents;

  conditionOnOwnConfig = eval [
    agents
    {
      options.out = settingOption;
    }
    (
      { config, ... }:
      {
        agents.x.enable = true;
        out = lib.mkIf config.agents.x.enable (
          lib.mapAttrs' (name: _: lib.nameValuePair "unit@${name}" "on") config.agents
        );
      }
    )
  ];

  freeform = (eval [
    {
      options.settings = mkOption {
        default = { };
        type = types.submodule {
          freeformType = types.attrsOf types.unspecified;
          options.store = mkOption {
            type = types.str;
            default = "file:///x";
          };
          options.region = mkOption {
            type = types.nullOr types.str;
            default = null;
          };
        };
      };
    }
    { settings.extra_key = 5; }
  ]).settings;

  undeclaredFails = fails (eval [
    { options.a = mkOption { type = types.int; default = 1; }; }
    { b = 2; }
  ]).a;

  wrongTypeFails = fails (eval [
    { options.a = mkOption { type = types.str; }; }
    { a = 1; }
  ]).a;

  undefinedFails = fails (eval [ { options.a = mkOption { type = types.str; }; } ]).a;

  conflictFails = fails (eval [
    { options.a = mkOption { type = types.str; }; }
    { a = "x"; }
    { a = "y"; }
  ]).a;

  positiveRefusesZero = fails (eval [
    agents
    { agents.x.count = 0; }
  ]).agents.x.count;

  pathAcceptsAbsoluteStrings = builtins.map types.path.check [
    "/run/keys/x"
    "relative"
  ];
}
