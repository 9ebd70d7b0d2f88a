# Sourced by hack/install-*.sh: fetch single .debs from any Debian suite without touching the system's
# apt sources or lists: a private apt state per installer and suite, $CACHE/apt-$APT_OWNER-<suite>.
# Needs CACHE and APT_OWNER set (each installer holds its own lock, so owners never share a state).

# The Debian mirror the system's own sources use (deb822 or one-line format); deb.debian.org otherwise.
debian_mirror() {
  local url
  url=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | sed -n 's#^URIs:[[:space:]]*\([^[:space:]]*/debian\)/\{0,1\}[[:space:]]*$#\1#p' | head -n1 || true)
  if [ -z "$url" ]; then
    url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | sed -n 's#^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]*/debian\)/\{0,1\}[[:space:]].*#\2#p' \
      | head -n1 || true)
  fi
  echo "${url:-http://deb.debian.org/debian}"
}

# apt_download SUITE PACKAGE: download PACKAGE's .deb from SUITE into the current directory. The
# package lists stay in $CACHE/apt-$APT_OWNER-<suite> until apt_forget_lists removes them.
apt_download() {
  local suite=$1 pkg=$2 apt_dir=$CACHE/apt-$APT_OWNER-$1 keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  local -a apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o APT::Sandbox::User=root -o Acquire::Languages=none -o APT::Get::List-Cleanup=0
  )
  if [ ! -f "$apt_dir/.updated" ]; then
    mkdir -p "$apt_dir"/{lists/partial,cache/archives/partial,etc}
    echo "deb [signed-by=$keyring] $(debian_mirror) $suite main" >"$apt_dir/etc/sources.list"
    apt-get "${apt_opts[@]}" -qq update
    touch "$apt_dir/.updated"
  fi
  apt-get "${apt_opts[@]}" -qq download "$pkg"
}

# The package lists (tens of MB), only needed again for a new recipe.
apt_forget_lists() {
  rm -rf "$CACHE/apt-$APT_OWNER-"*
}
