# NixOS module `services.hamsterbunker`: one HamsterBunker node per declared agent.
#
# Each enabled agent NAME becomes a complete unit `hamsterbunker@NAME.service`
# (not a drop-in on a template: see nix/README.md) with the settings, timing and
# hardening of systemd/hamsterbunker@.service, a config file
# /etc/hamsterbunker/NAME.toml rendered from `settings`, and the secret handed
# over with LoadCredential=. tests/ops/test_nix.py evaluates this module and checks
# the result against that unit file, key by key.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types;

  cfg = config.services.hamsterbunker;
  settingsFormat = pkgs.formats.toml { };
  enabledAgents = lib.filterAttrs (_: agent: agent.enable) cfg.agents;

  # The keys `hb run --instance NAME` reads (hamsterbunker/config.py). It stops
  # at start on any other key; the assertion below says so at build time instead.
  settingsKeys = [
    "store"
    "agent"
    "agent_id"
    "node_id"
    "region"
    "tick_ms"
    "lease_ttl_ms"
    "stop_grace_ms"
  ];

  # hb's rule for instance names (hamsterbunker/records.py). It also makes the
  # name safe to write into ExecStart= and unit and file names as it is.
  validName = name: builtins.match "[A-Za-z0-9][A-Za-z0-9._-]{0,63}" name != null;

  # Everything in systemd/hamsterbunker@.service that does not depend on the
  # agent. Each becomes a default (mkDefault), so a host overrides any of them
  # with a plain definition, e.g.
  #   systemd.services."hamsterbunker@NAME".serviceConfig.ProtectHome = "read-only";
  unitDefaults = {
    StartLimitIntervalSec = 120;
    StartLimitBurst = 5;
  };
  serviceDefaults = {
    Type = "notify";
    NotifyAccess = "main";
    ConfigurationDirectory = "hamsterbunker";
    StateDirectory = "hamsterbunker";
    StateDirectoryMode = "0700";
    UMask = "0077";

    WatchdogSec = "10s";
    TimeoutStartSec = "60s";
    TimeoutStopSec = "30s";
    Restart = "on-failure";
    RestartSec = "2s";
    # Exit 2 is a configuration mistake: restarting cannot fix it.
    RestartPreventExitStatus = "2 3";

    ProtectSystem = "strict";
    ProtectHome = true;
    PrivateTmp = true;
    PrivateDevices = true;
    DevicePolicy = "closed";
    PrivateUsers = true;
    ProtectHostname = true;
    ProtectClock = true;
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectProc = "invisible";
    ProcSubset = "pid";
    NoNewPrivileges = true;
    CapabilityBoundingSet = "";
    AmbientCapabilities = "";
    RestrictAddressFamilies = "AF_UNIX AF_INET AF_INET6";
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    RemoveIPC = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service"
      "~@privileged @resources"
    ];
    SystemCallErrorNumber = "EPERM";
  };

  # TOML has no null: optional keys left at null are left out, and hb applies
  # its own default.
  renderedSettings = agent: lib.filterAttrs (_: value: value != null) agent.settings;
  configFiles = lib.mapAttrs (
    name: agent: settingsFormat.generate "hamsterbunker-${name}.toml" (renderedSettings agent)
  ) enabledAgents;

  # The directory of a file:// store outside StateDirectory= (which is all the
  # unit may write otherwise), or null.
  extraStoreDir =
    agent:
    let
      found = builtins.match "file://(localhost)?(/[^?#%]*)" agent.settings.store;
      dir = if found == null then null else builtins.elemAt found 1;
    in
    if dir == null || lib.hasPrefix "/var/lib/hamsterbunker/" "${dir}/" then null else dir;

  agentService =
    name: agent:
    let
      storeDir = extraStoreDir agent;
    in
    lib.nameValuePair "hamsterbunker@${name}" {
      description = "HamsterBunker node for agent instance ${name}";
      documentation = [
        "https://github.com/hamsterbunker/hamsterbunker/blob/main/systemd/README.md"
      ];
      wants = [ "network-online.target" ];
      after = [
        "network-online.target"
        "remote-fs.target"
      ];
      wantedBy = [ "multi-user.target" ];
      # The config file lives in /etc, not in the unit: restart when it changes.
      restartTriggers = [ configFiles.${name} ];

      unitConfig = lib.mkMerge [
        (lib.mapAttrs (_: lib.mkDefault) unitDefaults)
        (lib.mkIf (storeDir != null) { RequiresMountsFor = [ storeDir ]; })
      ];
      serviceConfig = lib.mkMerge [
        (lib.mapAttrs (_: lib.mkDefault) serviceDefaults)
        {
          # The node itself is the main process (Type=notify): no shell, no wrapper.
          ExecStart = "${cfg.package}/bin/hb run --instance ${name}";
          User = cfg.user;
          Group = cfg.group;
          # toString: a path is never copied into the Nix store from here.
          LoadCredential = [ "secret:${toString agent.secretFile}" ];
        }
        (lib.mkIf (storeDir != null) { ReadWritePaths = [ storeDir ]; })
      ];
    };

  agentAssertions =
    name: agent:
    let
      option = "services.hamsterbunker.agents.${name}";
      secret = toString agent.secretFile;
      unknown = builtins.filter (key: !(builtins.elem key settingsKeys)) (
        builtins.attrNames agent.settings
      );
    in
    [
      {
        assertion = validName name;
        message = "${option}: the agent name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (it names hamsterbunker@NAME.service and /etc/hamsterbunker/NAME.toml).";
      }
      {
        assertion = !builtins.isPath agent.secretFile;
        message = "${option}.secretFile is a Nix path literal (${secret}), which would copy the secret into the Nix store where every user can read it; give it as a string, e.g. \"/run/keys/hb-secret\".";
      }
      {
        assertion = !lib.hasPrefix "${builtins.storeDir}/" secret;
        message = "${option}.secretFile ${secret} lies inside the Nix store, where every user can read it; keep the secret outside it (e.g. /run/keys/hb-secret, or a path from sops-nix or agenix).";
      }
      {
        # /etc/hamsterbunker/NAME.toml is a file in the Nix store, which every user can read.
        assertion = builtins.match "[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@.*" agent.settings.store == null;
        message = "${option}.settings.store holds a password, which would be readable by every user in the Nix store (the config file is there); use a server that needs none from this URL, e.g. TLS client certificates.";
      }
      {
        assertion = unknown == [ ];
        message = "${option}.settings: unknown key '${builtins.head unknown}' (hb run would refuse it); the keys are: ${lib.concatStringsSep ", " settingsKeys}.";
      }
    ];

  agentOptions =
    { name, ... }:
    {
      options = {
        enable = lib.mkEnableOption "the HamsterBunker node of this agent (hamsterbunker@NAME.service)";

        settings = mkOption {
          default = { };
          description = ''
            The node's config file /etc/hamsterbunker/NAME.toml, read by
            `hb run --instance NAME` (and by `hb-tui --instance NAME`). Options
            left at null are not written, and hb uses its default.
          '';
          example = lib.literalExpression ''
            {
              store = "file:///mnt/hamsterbunker";
              agent = "mypkg.agents:Summariser";
              region = "eu-central";
            }
          '';
          type = types.submodule {
            freeformType = settingsFormat.type;
            options = {
              store = mkOption {
                type = types.str;
                default = "file:///var/lib/hamsterbunker/${name}";
                defaultText = lib.literalExpression ''"file:///var/lib/hamsterbunker/''${name}"'';
                description = ''
                  Store URL, the same on every node of the cluster. A file:// store
                  outside /var/lib/hamsterbunker is made writable for the unit
                  (ReadWritePaths=, RequiresMountsFor=).
                '';
              };
              agent = mkOption {
                type = types.str;
                example = "mypkg.agents:Summariser";
                description = "The agent, as module:attribute, importable by the package's Python.";
              };
              agent_id = mkOption {
                type = types.nullOr types.str;
                default = null;
                description = "The agent id (default: the agent object's id).";
              };
              node_id = mkOption {
                type = types.nullOr types.str;
                default = null;
                description = "This node's id (default: the host name).";
              };
              region = mkOption {
                type = types.nullOr types.str;
                default = null;
                description = "This node's region, shown by hb status and hb-tui (default: local).";
              };
              tick_ms = mkOption {
                type = types.nullOr types.ints.positive;
                default = null;
                description = "Lease tick in milliseconds (default: 400).";
              };
              lease_ttl_ms = mkOption {
                type = types.nullOr types.ints.positive;
                default = null;
                description = "Lease TTL in milliseconds (default: 2000).";
              };
              stop_grace_ms = mkOption {
                type = types.nullOr types.ints.unsigned;
                default = null;
                description = "How long a stop lets the step in flight finish and be published before it is cancelled, in milliseconds (default: 10000); keep it well below TimeoutStopSec (30 s).";
              };
            };
          };
        };

        secretFile = mkOption {
          type = types.path;
          default = "/etc/hamsterbunker/${name}.secret";
          defaultText = lib.literalExpression ''"/etc/hamsterbunker/''${name}.secret"'';
          example = "/run/keys/hb-secret";
          description = ''
            File holding the cluster's secret (the same on every node), readable
            by root only. It must lie outside the Nix store: systemd reads it
            and hands the node a private copy (LoadCredential=secret:...).
          '';
        };
      };
    };
in
{
  options.services.hamsterbunker = {
    package = mkOption {
      type = types.package;
      default = pkgs.hamsterbunker or (pkgs.callPackage ./package.nix { });
      defaultText = lib.literalExpression "pkgs.hamsterbunker or (pkgs.callPackage ./nix/package.nix { })";
      description = ''
        The hamsterbunker package to use: its `hb` runs the nodes. The agents'
        Python code must be importable by it, e.g.
        `package.overridePythonAttrs (old: { dependencies = old.dependencies ++ [ my-agents ]; })`.
      '';
    };

    user = mkOption {
      type = types.str;
      default = "hamsterbunker";
      description = ''
        The user every node runs as. The module creates the user `hamsterbunker`;
        any other user must be declared elsewhere.
      '';
    };

    group = mkOption {
      type = types.str;
      default = "hamsterbunker";
      description = ''
        The group every node runs as. The module creates the group
        `hamsterbunker`; any other group must be declared elsewhere.
      '';
    };

    uid = mkOption {
      type = types.nullOr types.ints.unsigned;
      default = null;
      example = 850;
      description = ''
        A fixed UID for the user `hamsterbunker`. Nodes sharing a store on NFS
        write it as this user, so it needs the same UID on every node.
      '';
    };

    gid = mkOption {
      type = types.nullOr types.ints.unsigned;
      default = null;
      example = 850;
      description = "A fixed GID for the group `hamsterbunker` (see `uid`).";
    };

    agents = mkOption {
      type = types.attrsOf (types.submodule agentOptions);
      default = { };
      description = ''
        The agents this machine runs a node of: agent NAME gives the unit
        hamsterbunker@NAME.service and the config file /etc/hamsterbunker/NAME.toml.
      '';
    };
  };

  config = lib.mkIf (enabledAgents != { }) {
    assertions = builtins.concatLists (lib.mapAttrsToList agentAssertions enabledAgents);

    # A static user, not DynamicUser=: nodes sharing an NFS store need one UID.
    users.users = lib.mkIf (cfg.user == "hamsterbunker") {
      hamsterbunker = {
        isSystemUser = true;
        group = cfg.group;
        uid = cfg.uid;
        description = "HamsterBunker node";
        home = "/var/lib/hamsterbunker";
      };
    };
    users.groups = lib.mkIf (cfg.group == "hamsterbunker") {
      hamsterbunker.gid = cfg.gid;
    };

    environment.etc = lib.mapAttrs' (
      name: file: lib.nameValuePair "hamsterbunker/${name}.toml" { source = file; }
    ) configFiles;

    # hb status and hb-tui --instance NAME for the administrator.
    environment.systemPackages = [ cfg.package ];

    systemd.services = lib.mapAttrs' agentService enabledAgents;
  };
}
