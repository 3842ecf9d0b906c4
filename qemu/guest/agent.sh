# The command agent on /dev/ttyS1 (a Unix socket on the host).
#
# Host -> guest, one line each:
#   HELLO                     answered with "@@BRICK-READY"
#   RUN <nonce> <base64>      the script is decoded and run with lib.sh
#                             loaded; its output (stdout+stderr) follows,
#                             then "@@BRICK-RC <nonce> <exit status>".
port=/dev/ttyS1
stty -F $port raw -echo 2>/dev/null
exec 3<>$port
echo "@@BRICK-READY" >&3
while read -r verb nonce body <&3; do
    case "$verb" in
    HELLO)
        echo "@@BRICK-READY" >&3
        ;;
    RUN)
        echo "$body" | base64 -d > /tmp/cmd.sh
        ( cd /root && . /lib/brick/lib.sh && . /tmp/cmd.sh ) > /tmp/cmd.out 2>&1 < /dev/null
        rc=$?
        cat /tmp/cmd.out >&3
        echo "@@BRICK-RC $nonce $rc" >&3
        ;;
    esac
done
