# A stand-in for nixpkgs' `pkgs`: callPackage, python3Packages with a
# buildPythonApplication that returns its arguments, and formats.toml whose
# `generate` renders the TOML text itself (flat tables and arrays of them, as hb's config has).
# Derivations are attribute sets with a made-up store path; nothing is built.
{
  lib,
  # The python3Packages attributes there are; nix/package.nix may use no other.
  pythonPackages ? [ ],
}:
let
  fakeDerivation =
    name: attrs:
    attrs
    // {
      type = "derivation";
      inherit name;
      outPath = "${builtins.storeDir}/${builtins.substring 0 32 (builtins.hashString "sha256" name)}-${name}";
    };

  tomlKey = key: if builtins.match "[A-Za-z0-9_-]+" key != null then key else builtins.toJSON key;
  tomlValue =
    key: value:
    if builtins.isString value || builtins.isInt value || builtins.isBool value then
      builtins.toJSON value # JSON's strings, numbers and booleans are TOML's
    else
      throw "the stand-in formats.toml renders strings, integers and booleans only, not ${key}";
  keysOf =
    value:
    builtins.concatStringsSep "" (
      map (key: "${tomlKey key} = ${tomlValue key value.${key}}\n") (builtins.attrNames value)
    );
  # A list of flat tables is an array of tables ([[agents]]), after the plain keys.
  isTables = value: builtins.isList value && builtins.all builtins.isAttrs value;
  toTOML =
    value:
    keysOf (lib.filterAttrs (_: v: !isTables v) value)
    + builtins.concatStringsSep "" (
      lib.mapAttrsToList (
        key: entries: builtins.concatStringsSep "" (map (entry: "\n[[${tomlKey key}]]\n${keysOf entry}") entries)
      ) (lib.filterAttrs (_: isTables) value)
    );

  self = {
    inherit lib;

    callPackage =
      fn: overrides:
      let
        f = if builtins.isFunction fn then fn else import fn;
      in
      f (builtins.intersectAttrs (builtins.functionArgs f) self // overrides);

    python3Packages =
      lib.genAttrs pythonPackages (name: fakeDerivation name { pname = name; })
      // {
        buildPythonApplication = args: fakeDerivation "${args.pname}-${args.version}" args;
      };

    formats.toml =
      { }:
      {
        type = lib.types.attrsOf lib.types.unspecified;
        generate =
          name: value:
          fakeDerivation name {
            text = toTOML value;
            inherit value;
          };
      };
  };
in
self
