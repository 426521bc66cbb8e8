#!/usr/bin/env bash
# The system programs the tests run for real rather than imitate: OpenSSH's sshd and client
# (MPI launch through sshd, DevServer SSH sessions), WireGuard with its userspace implementation
# (wireguard-go, for kernels without the module), iptables and ping, used in network namespaces
# the tests create, jq and curl, which the hybrid gateway's peer sync runs, tmux, the shell a
# user leaves in a DevServer (the idle rule and the stop warning are tested on it), and chromium,
# which renders TensorBoard's scalars page in a test (headless, offline). Installs what is
# missing with apt-get (Debian/Ubuntu), as root or through sudo; prints nothing when all are
# there. Versions follow the distribution release, as in the images. The SSH tests also use
# setpriv (util-linux), useradd (passwd) and awk, and the DevServer tests unshare, nsenter,
# mount, setsid (util-linux), chroot and tar (their pods are processes in namespaces of their
# own on an overlay of this root, with a devpts of their own; devctl run syncs with tar and runs
# torchrun under setsid), which every Debian and Ubuntu system has.
set -euo pipefail
packages=(openssh-server openssh-client wireguard-tools wireguard-go iptables iproute2 iputils-ping jq curl tmux
  chromium)
missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
echo "Installing system packages the tests use: ${missing[*]}"
"${sudo[@]}" apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${missing[@]}"
