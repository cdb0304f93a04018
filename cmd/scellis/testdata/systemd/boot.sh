#!/bin/sh
# Boots systemd as PID 1 of new PID, mount, network, UTS, IPC and cgroup
# namespaces, on a volatile overlay of the host's root, for
# TestSiloUnitRunsTrainers (systemd_trainer_test.go). Nothing it does reaches the
# host: every write lands in the overlay's tmpfs (checked before systemd
# starts), /proc/sys and /sys are read-only, the network is its own, and
# its cgroups are the test's own (made and removed by the test; mounted
# here inside the cgroup namespace, so systemd sees them as the root).
#
# unshare kills its child (systemd, PID 1 of the namespaces, and with it
# every process in them) when it dies, so a killed go test leaves none.
#
# boot.sh STAGE: STAGE holds scellis, cnn/, data/, the units (silo.service,
# trainers.conf, test.conf) and cgroups (one "DIR OPTIONS" line per
# hierarchy: the mount's base name and its options, "cgroup2" for the
# unified one). The test writes "go" on stdin once this process is in its
# cgroups.
set -eu
S=$1
read -r go
exec unshare --pid --fork --kill-child=SIGKILL --mount --net --uts --ipc --cgroup --propagation private /bin/sh -eu -c '
S=$1
O=$S/ovl
mkdir -p $O
mount -t tmpfs -o mode=755 tmpfs $O
mkdir $O/lower $O/upper $O/work $O/root
mount --bind / $O/lower
mount -o remount,bind,ro $O/lower
mount -t overlay overlay -o lowerdir=$O/lower,upperdir=$O/upper,workdir=$O/work $O/root
R=$O/root
# The overlay takes every write: a file made in it is not on the host.
touch $R/.scellis-overlay-probe
test ! -e /.scellis-overlay-probe
mount -t proc proc $R/proc
mount --bind $R/proc/sys $R/proc/sys
mount -o remount,bind,ro $R/proc/sys
mount -t sysfs -o ro sysfs $R/sys
mount -t tmpfs -o mode=755 tmpfs $R/sys/fs/cgroup
while read -r dir opts; do
	mkdir -p $R/sys/fs/cgroup/$dir
	if [ "$opts" = cgroup2 ]; then
		mount -t cgroup2 cgroup2 $R/sys/fs/cgroup/$dir
	else
		mount -t cgroup -o "$opts" cgroup $R/sys/fs/cgroup/$dir
	fi
done < $S/cgroups
mount -t tmpfs -o mode=755 tmpfs $R/dev
for d in null zero full random urandom tty; do touch $R/dev/$d; mount --bind /dev/$d $R/dev/$d; done
mkdir $R/dev/shm $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts
ln -s pts/ptmx $R/dev/ptmx
for d in run tmp var/tmp; do mount -t tmpfs -o mode=1777 tmpfs $R/$d; done
chmod 755 $R/run
# The package s files where the .deb puts them; the test s data in /srv.
cp $S/scellis $R/usr/bin/scellis
cp $S/silo.service $R/usr/lib/systemd/system/scellis-silo@.service
grep -q "^scellis:" $R/etc/passwd || echo "scellis:x:64990:64990::/var/lib/scellis:/usr/sbin/nologin" >> $R/etc/passwd
grep -q "^scellis:" $R/etc/group || echo "scellis:x:64990:" >> $R/etc/group
mkdir -p $R/srv/scellis $R/etc/systemd/system/scellis-silo@.service.d $R/etc/systemd/system/scellis-silo@trainers.service.d
cp -r $S/cnn $S/data $R/srv/scellis/
chmod -R a+rX $R/srv/scellis
cp $S/test.conf $R/etc/systemd/system/scellis-silo@.service.d/test.conf
cp $S/trainers.conf $R/etc/systemd/system/scellis-silo@trainers.service.d/trainers.conf
printf "[Unit]\nDescription=TestSiloUnitRunsTrainers\n" > $R/etc/systemd/system/scellis-test.target
# Nothing but the units the test starts: the boot s usual targets are masked.
for u in network-online.target sysinit.target basic.target; do ln -sf /dev/null $R/etc/systemd/system/$u; done
cd $R
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
exec env container=scellis-test /lib/systemd/systemd --unit=scellis-test.target --log-target=console --log-level=notice
' sh "$S"
