#!/usr/bin/env bash
# Generates the man pages from the built binary's own help, so they cannot
# drift from it: thindisk(1) from `thindisk --help` and thindisk-SUB(1) from
# `thindisk SUB --help` for every subcommand `thindisk --help` lists. The
# build runs it whenever the binary changes (CMakeLists.txt, target man);
# nothing here is written by hand but the page skeleton (NAME, SYNOPSIS,
# DESCRIPTION, ARGUMENTS, OPTIONS, SEE ALSO).
#
# Usage: scripts/man.sh THINDISK OUTDIR
#   Writes OUTDIR/thindisk.1 and OUTDIR/thindisk-SUB.1, and removes any
#   other thindisk*.1 there (a page of a subcommand that is gone).
#   SOURCE_DATE_EPOCH, when set, dates the pages (reproducible builds);
#   otherwise they carry today's date.
#
# How CLI11's help is read (the layout of its default formatter):
#   line 1             the description ("thindisk: ..." for the main page)
#   "Usage: CMD ARGS"  the synopsis
#   "Positionals:", "Options:", "Subcommands:"  then entries up to a blank
#                      line: two spaces, the name column, the description
#                      from the column where "-h,--help"'s starts (a name
#                      too wide for it puts the description on the next line)
#   anything else      free text (the footer): paragraphs, and indented
#                      lines kept as they are (command lists, examples)
set -euo pipefail

die() { echo "man.sh: $*" >&2; exit 1; }
[[ $# == 2 ]] || die "usage: man.sh THINDISK OUTDIR"
TD=$1 OUT=$2
[[ -x $TD ]] || die "$TD is not an executable"
mkdir -p "$OUT"

VERSION=$("$TD" --version | awk '{ print $NF }')
[[ -n $VERSION ]] || die "$TD --version printed no version"
DATE=$(date -u ${SOURCE_DATE_EPOCH:+-d "@$SOURCE_DATE_EPOCH"} +%Y-%m-%d)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/thindisk-man-XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# render PAGE CMD SUBS HELPFILE: the troff page of CMD ("thindisk" or
# "thindisk SUB") from its --help text; SUBS lists the subcommands (the main
# page names their pages, a subcommand page names the main one).
render() {
  awk -v page="$1" -v cmd="$2" -v subs="$3" -v version="$VERSION" -v date="$DATE" '
    # Troff-safe text: backslashes escaped, and every dash as \- so that it
    # renders and copies as an ASCII "-" and a line never breaks after one
    # (a flag or a name like qemu-nbd stays whole; .nh stops hyphenation).
    function esc(s,    out, i, c) {
      gsub(/\\/, "\\e", s)
      out = ""
      for (i = 1; i <= length(s); i++) { c = substr(s, i, 1); out = out (c == "-" ? "\\-" : c) }
      return out
    }
    # A text line must not start with a control character.
    function line(s) { if (s ~ /^[.\047]/) s = "\\&" s; print s }
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
    function upper_page(s) { return toupper(s) }

    { lines[++n] = $0 }

    END {
      if (n < 2) { print "man.sh: " cmd " --help printed too little" > "/dev/stderr"; exit 1 }
      desc = lines[1]
      sub(/^thindisk: /, "", desc)
      intro = (cmd == "thindisk") ? lines[1] : desc
      # The description column, from the -h,--help entry.
      col = 31
      for (i = 1; i <= n; i++)
        if (lines[i] ~ /^  -h,--help  / && match(lines[i], /Print this help/)) { col = RSTART; break }

      # 1. Split the help into the synopsis, the entry sections and the footer.
      synopsis = ""; section = ""; nfoot = 0; nent = 0
      for (i = 2; i <= n; i++) {
        l = lines[i]
        if (section == "" && l ~ /^Usage: /) {
          synopsis = substr(l, 8)
          if (index(synopsis, cmd) == 1) synopsis = substr(synopsis, length(cmd) + 1)
          synopsis = trim(synopsis)
          continue
        }
        if (l == "Positionals:" || l == "Options:" || l == "Subcommands:") { section = l; continue }
        if (section != "") {
          if (l == "") { section = ""; continue }
          if (substr(l, 1, col - 1) ~ /^ +$/ && nent > 0) {   # a continued description
            edesc[nent] = edesc[nent] (edesc[nent] == "" ? "" : " ") trim(l)
            continue
          }
          ++nent; esec[nent] = section
          if (length(l) >= col && substr(l, col - 1, 1) == " " && substr(l, col, 1) != " ") {
            ename[nent] = trim(substr(l, 1, col - 1)); edesc[nent] = trim(substr(l, col))
          } else {
            ename[nent] = trim(l); edesc[nent] = ""
          }
          continue
        }
        foot[++nfoot] = l
      }
      if (synopsis == "") { print "man.sh: no Usage line in " cmd " --help" > "/dev/stderr"; exit 1 }

      # 2. The page.
      name = page
      printf ".TH %s 1 \"%s\" \"thindisk %s\" \"User Commands\"\n", upper_page(page), date, version
      print ".nh"    # no hyphenation: words and flags stay as --help prints them
      print ".ad l"  # ragged right: no stretched gaps between words
      print ".SH NAME"
      line(esc(name) " \\- " esc(desc))
      print ".SH SYNOPSIS"
      line("\\fB" esc(cmd) "\\fR " esc(synopsis))
      print ".SH DESCRIPTION"
      line(esc(intro) ".")
      if (cmd == "thindisk")
        line("Each subcommand has its own page, and prints the same text with \\fB" \
             "thindisk\\fR \\fISUBCOMMAND\\fR \\fB\\-\\-help\\fR.")
      # The footer: paragraphs filled, indented lines kept as printed.
      nf = 0; para = 1
      for (i = 1; i <= nfoot; i++) {
        l = foot[i]
        if (l == "") { if (nf) { print ".fi"; nf = 0 } para = 1; continue }
        if (l ~ /^[ \t]/) {
          if (!nf) { print ".PP"; print ".nf"; nf = 1 }
        } else {
          if (nf) { print ".fi"; nf = 0; para = 1 }
          if (para) { print ".PP"; para = 0 }
        }
        line(esc(l))
      }
      if (nf) print ".fi"

      # Entries: Positionals as ARGUMENTS, Options, Subcommands (main page).
      split("Positionals:|ARGUMENTS|Options:|OPTIONS|Subcommands:|SUBCOMMANDS", h, "|")
      for (k = 1; k <= 5; k += 2) {
        shown = 0
        for (e = 1; e <= nent; e++) {
          if (esec[e] != h[k]) continue
          if (!shown) { print ".SH " h[k + 1]; shown = 1 }
          print ".TP"
          first = ename[e]; rest = ""
          if (match(first, /[ \t]/)) { rest = trim(substr(first, RSTART)); first = substr(first, 1, RSTART - 1) }
          if (h[k] == "Options:") {
            m = split(first, flags, ",")
            tag = ""
            for (f = 1; f <= m; f++) tag = tag (f > 1 ? ", " : "") "\\fB" esc(flags[f]) "\\fR"
          } else if (h[k] == "Positionals:") {
            tag = "\\fI" esc(first) "\\fR"
          } else {
            tag = "\\fB" esc(first) "\\fR"
          }
          if (rest != "") tag = tag " " esc(rest)
          line(tag)
          d = esc(edesc[e])
          if (h[k] == "Subcommands:") d = d (d == "" ? "" : ". ") "See \\fBthindisk\\-" esc(first) "\\fR(1)."
          line(d)
        }
      }

      # 3. SEE ALSO.
      print ".SH SEE ALSO"
      if (cmd == "thindisk") {
        m = split(subs, list, " ")
        out = ""
        for (f = 1; f <= m; f++) out = out (f > 1 ? ",\n" : "") "\\fBthindisk\\-" esc(list[f]) "\\fR(1)"
        print out
      } else {
        print "\\fBthindisk\\fR(1)"
      }
    }
  ' "$4"
}

"$TD" --help >"$WORK/help" || die "$TD --help failed"
SUBS=$(awk '/^Subcommands:$/ { on = 1; next }
            on && /^$/ { on = 0 }
            on && /^  [a-z]/ { print $1 }' "$WORK/help" | tr '\n' ' ')
SUBS=${SUBS% }
[[ -n $SUBS ]] || die "$TD --help lists no subcommands"

render thindisk thindisk "$SUBS" "$WORK/help" >"$WORK/thindisk.1"
for sub in $SUBS; do
  [[ $sub =~ ^[a-z][a-z0-9_-]*$ ]] || die "unexpected subcommand name '$sub'"
  "$TD" "$sub" --help >"$WORK/help.$sub" || die "$TD $sub --help failed"
  render "thindisk-$sub" "thindisk $sub" "$SUBS" "$WORK/help.$sub" >"$WORK/thindisk-$sub.1"
done

# Replace the old set only once every page rendered.
rm -f "$OUT"/thindisk.1 "$OUT"/thindisk-*.1
mv "$WORK"/*.1 "$OUT"/
