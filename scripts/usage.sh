# Sourced first by the scripts here: with -h or --help as the first argument, the script prints its
# header comment (what it does, its usage) and exits.
case "${1:-}" in
  -h | --help)
    sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p}' "$0"
    exit 0
    ;;
esac
