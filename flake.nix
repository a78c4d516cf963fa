{
  description = "HamsterBunker: keeps one long-running AI agent alive when the machine under it dies";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      packages = forAllSystems (pkgs: rec {
        hamsterbunker = pkgs.callPackage ./nix/package.nix { };
        default = hamsterbunker;
      });

      # pkgs.hamsterbunker, which the module's `package` option takes when present.
      overlays.default = final: _prev: {
        hamsterbunker = final.callPackage ./nix/package.nix { };
      };

      # services.hamsterbunker; without the overlay it builds the package from
      # this source with the host's own nixpkgs.
      nixosModules.default = ./nix/module.nix;
      nixosModules.hamsterbunker = self.nixosModules.default;
    };
}
