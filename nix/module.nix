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
    "sync_delay_ms"
    "stop_grace_ms"
    "log_level"
    "step_retry_ms"
    "step_retry_max_ms"
    "max_step_failures"
    "http"
    "agents"
    "create_store_on"
    "hot_standby"
  ];

  # hb's rule for instance names (hamsterbunker/records.py). It also makes the
  # name safe to write into ExecStart= and unit and file names as it is.
  validName = name: builtins.match "[A-Za-z0-9][A-Za-z0-9._-]{0,63}" name != null;

  # HOST:PORT as `hb run --http` takes it (hamsterbunker/http_address.py): an IPv6
  # address in brackets, an empty host for every address, a port from 1 to 65535.
  validHttp =
    text:
    let
      parts = builtins.match "(\\[[0-9A-Fa-f:.]+]|[^]/ :[]*):([1-9][0-9]{0,4})" text;
    in
    parts != null && builtins.fromJSON (builtins.elemAt parts 1) <= 65535;

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

  # The store: settings.store, or with localOnly a directory on this machine
  # (as `hb init --local-only` writes). Neither fails an assertion below.
  localStore = name: "file:///var/lib/hamsterbunker/${name}";
  storeOf = name: agent: if agent.settings.store == null then localStore name else agent.settings.store;

  # TOML has no null: optional keys left at null are left out, and hb applies
  # its own default.
  renderedSettings =
    name: agent:
    let
      present = lib.filterAttrs (_: value: value != null);
    in
    present agent.settings
    // { store = storeOf name agent; }
    // lib.optionalAttrs (agent.settings.agents != null) {
      agents = map present agent.settings.agents;
    };
  configFiles = lib.mapAttrs (
    name: agent: settingsFormat.generate "hamsterbunker-${name}.toml" (renderedSettings name agent)
  ) enabledAgents;

  # The directory of a file:// store outside StateDirectory= (which is all the
  # unit may write otherwise), or null.
  extraStoreDir =
    name: agent:
    let
      found = builtins.match "file://(localhost)?(/[^?#%]*)" (storeOf name agent);
      dir = if found == null then null else builtins.elemAt found 1;
    in
    if dir == null || lib.hasPrefix "/var/lib/hamsterbunker/" "${dir}/" then null else dir;

  agentService =
    name: agent:
    let
      storeDir = extraStoreDir name agent;
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
        # A default store on the local disk would give every machine its own cluster.
        assertion = agent.settings.store != null || agent.localOnly;
        message = "${option}: set settings.store to the store every node of the cluster shares (e.g. \"file:///mnt/hamsterbunker\" on NFS, \"etcd://...\"), or localOnly = true for a cluster of this one machine (store ${localStore name}).";
      }
      {
        assertion = agent.settings.store == null || !agent.localOnly;
        message = "${option}: settings.store and localOnly = true exclude each other: the store is shared by the nodes of a cluster, localOnly keeps a cluster of this one machine in ${localStore name}.";
      }
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
        assertion = builtins.match "[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@.*" (storeOf name agent) == null;
        message = "${option}.settings.store holds a password, which would be readable by every user in the Nix store (the config file is there); use a server that needs none from this URL, e.g. TLS client certificates.";
      }
      {
        assertion = builtins.elem agent.settings.log_level [ null "debug" "info" "warning" "error" ];
        message = "${option}.settings.log_level must be debug, info, warning or error (hb run would refuse it), not '${toString agent.settings.log_level}'.";
      }
      {
        assertion = agent.settings.http == null || validHttp agent.settings.http;
        message = "${option}.settings.http must be HOST:PORT with a port from 1 to 65535, e.g. \"127.0.0.1:9100\" or \"[::1]:9100\" (hb run would refuse it), not '${toString agent.settings.http}'.";
      }
      {
        # hb run keeps one agent (agent, agent_id) or several ([[agents]]), never both.
        assertion = (agent.settings.agent != null) != (agent.settings.agents != null);
        message = "${option}.settings: set agent (one agent) or agents (several in one process, each { agent = \"module:attribute\"; agent_id = \"...\"; }), not both and not neither.";
      }
      {
        assertion = agent.settings.agents == null || agent.settings.agent_id == null;
        message = "${option}.settings: agent_id goes into each entry of agents, not beside it.";
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
                type = types.nullOr types.str;
                default = null;
                example = "file:///mnt/hamsterbunker";
                description = ''
                  Store URL, the same on every node of the cluster; required unless
                  localOnly is set. A file:// store outside /var/lib/hamsterbunker is
                  made writable for the unit (ReadWritePaths=, RequiresMountsFor=).
                '';
              };
              agent = mkOption {
                type = types.nullOr types.str;
                default = null;
                example = "mypkg.agents:Summariser";
                description = "The agent, as module:attribute, importable by the package's Python (or agents, for several).";
              };
              agents = mkOption {
                type = types.nullOr (
                  types.listOf (
                    types.submodule {
                      options = {
                        agent = mkOption {
                          type = types.str;
                          description = "The agent, as module:attribute.";
                        };
                        agent_id = mkOption {
                          type = types.nullOr types.str;
                          default = null;
                          description = "Its agent id (default: the agent object's id).";
                        };
                      };
                    }
                  )
                );
                default = null;
                example = lib.literalExpression ''
                  [
                    { agent = "mypkg.agents:Support"; agent_id = "support-acme"; }
                    { agent = "mypkg.agents:Support"; agent_id = "support-globex"; }
                  ]
                '';
                description = ''
                  Several agents kept by this one node process ([[agents]] in the
                  config file), in place of agent and agent_id: one event loop and one
                  store connection for all, each agent with its own lease. Nodes that
                  keep the same agents spread their leases evenly among them.
                '';
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
              sync_delay_ms = mkOption {
                type = types.nullOr types.ints.positive;
                default = null;
                description = "With a syncdir:// store (required there, refused with any other): the longest the sync tool takes to bring a file to the other machines, in milliseconds; lease_ttl_ms must be at least 2 × (tick_ms + sync_delay_ms). The unit must also be allowed to write the folder (ReadWritePaths=).";
              };
              stop_grace_ms = mkOption {
                type = types.nullOr types.ints.unsigned;
                default = null;
                description = "How long a stop lets the step in flight finish and be published before it is cancelled, in milliseconds (default: 10000); keep it well below TimeoutStopSec (30 s).";
              };
              log_level = mkOption {
                type = types.nullOr types.str;
                default = null;
                description = "The least important events the node logs to the journal (default: info); debug adds a line per step and message, and `journalctl -p warning` shows what needs a look whatever this is.";
              };
              step_retry_ms = mkOption {
                type = types.nullOr types.ints.positive;
                default = null;
                description = "A step that raised is retried after this many milliseconds, doubling (±20%) up to step_retry_max_ms (default: 1000).";
              };
              step_retry_max_ms = mkOption {
                type = types.nullOr types.ints.positive;
                default = null;
                description = "The longest wait between retries of a failing step, in milliseconds (default: 60000).";
              };
              max_step_failures = mkOption {
                type = types.nullOr types.ints.unsigned;
                default = null;
                description = "After this many failed steps in a row the node hands the lease to another node and holds off taking it back; 0: never (default: 10).";
              };
              http = mkOption {
                type = types.nullOr types.str;
                default = null;
                example = "127.0.0.1:9100";
                description = "HOST:PORT where the node serves /metrics (Prometheus), /health, /leader and /status (default: none). Open the port in networking.firewall only if something off this machine scrapes it.";
              };
              create_store_on = mkOption {
                type = types.nullOr types.str;
                default = null;
                example = "node1";
                description = "The host name of the one node that may create the store if it does not exist yet (a new cluster, or localOnly), e.g. config.networking.hostName on that node; every other node refuses to, so that a mistyped or unmounted store is not made anew (default: none).";
              };
              hot_standby = mkOption {
                type = types.nullOr types.bool;
                default = null;
                description = "As a standby, keep a copy of the newest checkpoint in memory, fetched as the leader publishes, so that a takeover reads none (default: true); false for states too large to hold twice.";
              };
            };
          };
        };

        localOnly = mkOption {
          type = types.bool;
          default = false;
          description = ''
            A cluster of this one machine: with settings.store left unset, the
            store is file:///var/lib/hamsterbunker/NAME, on the local disk (as
            `hb init NAME --local-only`). Without it settings.store must be set,
            since a local store on every machine would make as many clusters,
            each with its own leader of the agent.
          '';
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
            While the secret is rotated (hb rotate-secret), one secret a line,
            the newest first.
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
