# The command agent: `agent.sh /dev/ttyS1` (commands) and `agent.sh
# /dev/ttyS2` (diagnostics, answers while a command hangs); each port is a
# Unix socket on the host.
#
# Host -> guest, one line each:
#   HELLO                     answered with "@@BRICK-READY"
#   RUN <nonce> <base64>      the script is decoded and run with lib.sh
#                             loaded; its output (stdout+stderr) follows,
#                             then "@@BRICK-RC <nonce> <exit status>".
port=${1:-/dev/ttyS1}
name=$(basename $port)
stty -F $port raw -echo 2>/dev/null
exec 3<>$port
echo "@@BRICK-READY" >&3
while read -r verb nonce body <&3; do
    case "$verb" in
    HELLO)
        echo "@@BRICK-READY" >&3
        ;;
    RUN)
        echo "$body" | base64 -d > /tmp/cmd.$name.sh
        ( cd /root && . /lib/brick/lib.sh && . /tmp/cmd.$name.sh ) > /tmp/cmd.$name.out 2>&1 < /dev/null
        rc=$?
        cat /tmp/cmd.$name.out >&3
        echo "@@BRICK-RC $nonce $rc" >&3
        ;;
    esac
done
