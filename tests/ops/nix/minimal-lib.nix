# A small stand-in for nixpkgs' `lib`, written for tests/ops/test_nix.py: just what
# nix/module.nix, nix/package.nix, flake.nix and the test's stubs use, with the
# module system's semantics for them (option trees, mkIf/mkMerge pushed down to
# the options, priorities, attrsOf/listOf/nullOr/submodule merging, freeform
# submodules, "does not exist" for undeclared options). Names and behaviour
# follow nixpkgs/lib (modules.nix, options.nix, types.nix); it is not a copy.
#
# The same tests run against the real lib when HB_NIXPKGS_LIB points at one,
# and tests/ops/nix/lib-cases.nix pins the semantics both must agree on.
let
  inherit (builtins)
    all
    any
    attrNames
    concatLists
    concatMap
    elem
    filter
    foldl'
    functionArgs
    head
    intersectAttrs
    isAttrs
    isBool
    isFunction
    isInt
    isList
    isPath
    isString
    length
    listToAttrs
    mapAttrs
    substring
    tail
    toJSON
    typeOf
    ;

  lib = rec {
    inherit
      all
      any
      attrNames
      concatLists
      concatMap
      elem
      filter
      head
      isAttrs
      isBool
      isFunction
      isInt
      isList
      isPath
      isString
      length
      mapAttrs
      ;

    # -- lists, attribute sets, strings -------------------------------------------

    id = x: x;
    last = list: builtins.elemAt list (length list - 1);
    toList = x: if isList x then x else [ x ];
    reverseList = xs: builtins.genList (n: builtins.elemAt xs (length xs - n - 1)) (length xs);
    optional = cond: x: if cond then [ x ] else [ ];
    optionals = cond: xs: if cond then xs else [ ];
    optionalAttrs = cond: set: if cond then set else { };
    unique = foldl' (acc: x: if elem x acc then acc else acc ++ [ x ]) [ ];
    nameValuePair = name: value: { inherit name value; };
    genAttrs = names: f: listToAttrs (map (n: nameValuePair n (f n)) names);
    mapAttrs' = f: set: listToAttrs (map (n: f n set.${n}) (attrNames set));
    mapAttrsToList = f: set: map (n: f n set.${n}) (attrNames set);
    filterAttrs = pred: set: removeAttrs set (filter (n: !pred n set.${n}) (attrNames set));
    zipAttrsWith = builtins.zipAttrsWith;
    concatStringsSep = builtins.concatStringsSep;
    hasPrefix = prefix: str: substring 0 (builtins.stringLength prefix) str == prefix;
    isDerivation = x: isAttrs x && (x.type or null) == "derivation";
    isStringLike = x: isString x || isPath x || x ? outPath || x ? __toString;
    # A store object itself, not a path inside one.
    isStorePath =
      x:
      isStringLike x && builtins.match "${builtins.storeDir}/[^/]+" (toString x) != null;
    literalExpression = text: {
      _type = "literalExpression";
      inherit text;
    };
    showOption = concatStringsSep ".";
    showValue = v: if isString v || isInt v || isBool v || v == null then toJSON v else "<${typeOf v}>";

    # -- properties: mkIf, mkMerge, priorities -------------------------------------

    mkIf = condition: content: {
      _type = "if";
      inherit condition content;
    };
    mkMerge = contents: {
      _type = "merge";
      inherit contents;
    };
    mkOverride = priority: content: {
      _type = "override";
      inherit priority content;
    };
    defaultOverridePriority = 100;
    mkOptionDefault = mkOverride 1500;
    mkDefault = mkOverride 1000;
    mkForce = mkOverride 50;

    # Above an option, mkIf/mkMerge/mkOverride on an attribute set move onto each
    # attribute, so attribute names are known without evaluating any condition.
    pushDownProperties =
      cfg:
      if (cfg._type or "") == "merge" then
        concatMap pushDownProperties cfg.contents
      else if (cfg._type or "") == "if" then
        map (mapAttrs (_: v: mkIf cfg.condition v)) (pushDownProperties cfg.content)
      else if (cfg._type or "") == "override" then
        map (mapAttrs (_: v: mkOverride cfg.priority v)) (pushDownProperties cfg.content)
      else
        [ cfg ];

    # At an option: mkMerge splits, mkIf keeps or drops.
    dischargeProperties =
      def:
      if (def._type or "") == "merge" then
        concatMap dischargeProperties def.contents
      else if (def._type or "") == "if" then
        if !isBool def.condition then
          throw "mkIf called with a non-Boolean condition"
        else if def.condition then
          dischargeProperties def.content
        else
          [ ]
      else
        [ def ];

    # Keep only the definitions of the highest priority (the lowest number).
    filterOverrides =
      defs:
      let
        priority = def: if (def.value._type or "") == "override" then def.value.priority else defaultOverridePriority;
        highest = foldl' (best: def: if priority def < best then priority def else best) 9999 defs;
        strip = def: if (def.value._type or "") == "override" then def // { value = def.value.content; } else def;
      in
      concatMap (def: if priority def == highest then [ (strip def) ] else [ ]) defs;

    # -- options and merge functions ---------------------------------------------------

    mkOption = attrs: attrs // { _type = "option"; };
    isOption = x: isAttrs x && (x._type or "") == "option";
    mkEnableOption =
      name:
      mkOption {
        type = types.bool;
        default = false;
        example = true;
        description = "Whether to enable ${name}.";
      };

    mergeEqualOption =
      loc: defs:
      if defs == [ ] then
        abort "mergeEqualOption: no definitions"
      else
        (foldl' (
          first: def:
          if def.value != first.value then
            throw "The option `${showOption loc}' has conflicting definition values:\n- In `${first.file}': ${showValue first.value}\n- In `${def.file}': ${showValue def.value}"
          else
            first
        ) (head defs) (tail defs)).value;

    mergeOneOption =
      loc: defs:
      if length defs == 1 then
        (head defs).value
      else
        throw "The unique option `${showOption loc}' is defined multiple times.";

    mergeDefaultOption =
      loc: defs:
      let
        values = map (def: def.value) defs;
      in
      if length values == 1 then
        head values
      else if all isList values then
        concatLists values
      else if all isAttrs values then
        foldl' (a: b: a // b) { } values
      else if all isBool values then
        any id values
      else if all isString values then
        builtins.concatStringsSep "" values
      else
        throw "Cannot merge definitions of `${showOption loc}'.";

    # The definitions of one option (or attribute of an attrsOf) after
    # properties and priorities: { value = ...; } or { } when none is left.
    mergeDefinitions =
      loc: type: defs:
      let
        discharged = concatMap (
          def:
          map (value: {
            inherit (def) file;
            inherit value;
          }) (dischargeProperties def.value)
        ) defs;
        winners = filterOverrides discharged;
        wrong = filter (def: !type.check def.value) winners;
      in
      if winners == [ ] then
        { }
      else if wrong != [ ] then
        throw "A definition for option `${showOption loc}' is not of type `${type.description}'. Definition values:\n- In `${(head wrong).file}': ${showValue (head wrong).value}"
      else
        { value = type.merge loc winners; };

    # -- types ---------------------------------------------------------------------

    mkOptionType =
      attrs:
      {
        _type = "option-type";
        description = attrs.name;
        check = _: true;
        merge = mergeDefaultOption;
      }
      // attrs;

    types = rec {
      inherit mkOptionType;

      addCheck = type: check: type // { check = x: type.check x && check x; };

      unspecified = mkOptionType { name = "unspecified"; };

      bool = mkOptionType {
        name = "bool";
        description = "boolean";
        check = isBool;
        merge = mergeEqualOption;
      };

      int = mkOptionType {
        name = "int";
        description = "signed integer";
        check = isInt;
        merge = mergeEqualOption;
      };

      ints = {
        unsigned = addCheck int (x: x >= 0) // {
          name = "unsignedInt";
          description = "unsigned integer, meaning >=0";
        };
        positive = addCheck int (x: x > 0) // {
          name = "positiveInt";
          description = "positive integer, meaning >0";
        };
      };

      str = mkOptionType {
        name = "str";
        description = "string";
        check = isString;
        merge = mergeEqualOption;
      };

      path = mkOptionType {
        name = "path";
        description = "absolute path";
        check = x: isStringLike x && substring 0 1 (toString x) == "/";
        merge = mergeEqualOption;
      };

      package = mkOptionType {
        name = "package";
        description = "package";
        check = x: isDerivation x || isStorePath x;
        merge = mergeOneOption;
      };

      nullOr =
        elemType:
        mkOptionType {
          name = "nullOr";
          description = "null or ${elemType.description}";
          check = x: x == null || elemType.check x;
          merge =
            loc: defs:
            let
              nulls = length (filter (def: def.value == null) defs);
            in
            if nulls == length defs then
              null
            else if nulls != 0 then
              throw "The option `${showOption loc}' is defined both null and not null."
            else
              elemType.merge loc defs;
        };

      listOf =
        elemType:
        mkOptionType {
          name = "listOf";
          description = "list of ${elemType.description}";
          check = isList;
          merge =
            loc: defs:
            concatMap (
              def:
              concatMap (
                value:
                let
                  merged = mergeDefinitions loc elemType [
                    {
                      inherit (def) file;
                      inherit value;
                    }
                  ];
                in
                optional (merged ? value) merged.value
              ) def.value
            ) defs;
        };

      attrsOf =
        elemType:
        mkOptionType {
          name = "attrsOf";
          description = "attribute set of ${elemType.description}";
          check = isAttrs;
          merge =
            loc: defs:
            let
              byName = zipAttrsWith (name: nameDefs: mergeDefinitions (loc ++ [ name ]) elemType nameDefs) (
                map (
                  def:
                  mapAttrs (_: value: {
                    inherit (def) file;
                    inherit value;
                  }) def.value
                ) defs
              );
            in
            mapAttrs (_: merged: merged.value) (filterAttrs (_: merged: merged ? value) byName);
        };

      # Each definition is a module of its own; `name` is the attribute it sits under.
      submodule =
        modules:
        mkOptionType {
          name = "submodule";
          description = "submodule";
          check = x: isAttrs x || isFunction x || isPath x;
          merge =
            loc: defs:
            (evalModules {
              modules =
                toList modules
                ++ map (def: {
                  _file = def.file;
                  imports = [ def.value ];
                }) defs;
              specialArgs.name = last loc;
              prefix = loc;
            }).config;
        };
    };

    # -- the module system -------------------------------------------------------------

    evalModules =
      {
        modules,
        specialArgs ? { },
        prefix ? [ ],
      }:
      let
        args = {
          inherit lib config;
          options = declarations;
        }
        // specialArgs;

        # Every module, imports included, as { file, options, config, freeformType }.
        normalise =
          fallbackFile: module:
          let
            file = if isPath module then toString module else fallbackFile;
            value = if isPath module then import module else module;
            called = if isFunction value then value (intersectAttrs (functionArgs value) args) else value;
            known = [
              "_file"
              "key"
              "imports"
              "options"
              "config"
              "freeformType"
              "meta"
            ];
            structured = called ? options || called ? config;
            unsupported = attrNames (removeAttrs called known);
          in
          {
            file = called._file or file;
            imports = called.imports or [ ];
            options = called.options or { };
            freeformType = called.freeformType or null;
            config =
              if !structured then
                removeAttrs called known
              else if unsupported != [ ] then
                throw "Module `${file}' has an unsupported attribute `${head unsupported}'."
              else
                called.config or { };
          };
        collect =
          file: list:
          concatMap (
            module:
            let
              normal = normalise file module;
            in
            [ normal ] ++ collect normal.file normal.imports
          ) list;
        collected = collect "<unknown-file>" modules;

        declarations = foldl' (a: b: a // b) { } (map (m: m.options) collected);
        freeformTypes = filter (t: t != null) (map (m: m.freeformType) collected);

        # As in nixpkgs, definitions of equal priority are merged last module first
        # (it shows in the order of merged lists).
        root = evalNode prefix (map (m: {
          inherit (m) file;
          value = m.options;
        }) collected) (map (m: {
          inherit (m) file;
          value = m.config;
        }) (reverseList collected));

        config =
          if freeformTypes == [ ] then
            root.checked
          else
            (head freeformTypes).merge prefix root.unmatchedDefs // root.value;
      in
      {
        inherit config;
        options = declarations;
      };

    # One level of the option tree: `decls` are the option declarations at this
    # level, `defs` the definitions. Declared names become options or deeper
    # levels; a definition of an undeclared name is an error when the level is
    # read, unless the (sub)module is freeform.
    evalNode =
      loc: decls: defs:
      let
        pushed = concatMap (
          def:
          map (value: {
            inherit (def) file;
            inherit value;
          }) (pushDownProperties def.value)
        ) defs;
        declaredNames = unique (concatMap (decl: attrNames decl.value) decls);
        definedNames = unique (concatMap (def: attrNames def.value) pushed);
        unmatchedNames = filter (n: !elem n declaredNames) definedNames;
        at =
          n: list:
          concatMap (
            item:
            optional (item.value ? ${n}) {
              inherit (item) file;
              value = item.value.${n};
            }
          ) list;
        child =
          n:
          let
            childDecls = at n decls;
            childDefs = at n pushed;
          in
          if isOption (head childDecls).value then
            if length childDecls > 1 then
              throw "The option `${showOption (loc ++ [ n ])}' is declared more than once."
            else
              evalOption (loc ++ [ n ]) (head childDecls) childDefs
          else
            (evalNode (loc ++ [ n ]) childDecls childDefs).checked;
        value = genAttrs declaredNames child;
      in
      {
        inherit value;
        unmatchedDefs = concatMap (
          def:
          let
            extra = intersectAttrs (genAttrs unmatchedNames (_: null)) def.value;
          in
          optional (extra != { }) {
            inherit (def) file;
            value = extra;
          }
        ) pushed;
        checked =
          if unmatchedNames == [ ] then
            value
          else
            throw "The option `${showOption (loc ++ [ (head unmatchedNames) ])}' does not exist.";
      };

    evalOption =
      loc: decl: defs:
      let
        option = decl.value;
        type = option.type or types.unspecified;
        withDefault =
          optional (option ? default) {
            inherit (decl) file;
            value = mkOptionDefault option.default;
          }
          ++ defs;
        merged = mergeDefinitions loc type withDefault;
        value =
          if merged ? value then merged.value else throw "The option `${showOption loc}' is used but not defined.";
      in
      if option ? apply then option.apply value else value;
  };
in
lib
