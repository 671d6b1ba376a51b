package kubetest

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// StorageClass is the test cluster's default StorageClass. A fake external
// provisioner (running with the cluster) makes a PersistentVolume for each
// claim of it, in any access mode (ReadWriteMany included), which the real
// PV controller binds; a released volume is deleted, as a dynamic
// provisioner's with reclaim policy Delete. Nothing is stored anywhere:
// kwok's pods never mount it.
const StorageClass = "kubetest-rwx"

const volumeProvisioner = "kubetest.talkide.dev/fake"

// StorageClassNoIdmap is, on a cluster with a real node whose host has
// FUSE, a ReadWriteMany class that stands in for NFS: each volume is a
// bindfs (FUSE) mount, a filesystem that refuses idmapped mounts as NFS
// does, so a pod with hostUsers: false cannot mount it.
const StorageClassNoIdmap = "kubetest-nfs"

// provisionVolumes runs the fake provisioner until ctx ends.
func (c *Cluster) provisionVolumes(ctx context.Context) error {
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: StorageClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       volumeProvisioner,
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
	if _, err := c.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubetest: create StorageClass: %w", err)
	}
	if f, ok := c.Node(); ok && f.FUSE {
		nfs := sc.DeepCopy()
		nfs.Name, nfs.Annotations = StorageClassNoIdmap, nil
		if _, err := c.client.StorageV1().StorageClasses().Create(ctx, nfs, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kubetest: create StorageClass: %w", err)
		}
	}
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			c.provisionPass(ctx)
		}
	}()
	return nil
}

// provisionPass makes a volume for every pending claim of the test
// classes and deletes the released ones. Errors are retried on the next
// pass. With a real node a volume is a directory of the node's state (a
// bindfs mount of one for StorageClassNoIdmap); else a path nothing
// mounts.
func (c *Cluster) provisionPass(ctx context.Context) {
	pvcs, err := c.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, pvc := range pvcs.Items {
		if pvc.Spec.StorageClassName == nil || (*pvc.Spec.StorageClassName != StorageClass && *pvc.Spec.StorageClassName != StorageClassNoIdmap) ||
			pvc.Spec.VolumeName != "" || pvc.Status.Phase != corev1.ClaimPending || pvc.DeletionTimestamp != nil {
			continue
		}
		path := "/kubetest/volumes/" + string(pvc.UID)
		if c.node != nil {
			var err error
			if path, err = c.node.makeVolume(string(pvc.UID), *pvc.Spec.StorageClassName == StorageClassNoIdmap); err != nil {
				fmt.Fprintf(os.Stderr, "kubetest: volume for %s/%s: %v\n", pvc.Namespace, pvc.Name, err)
				continue
			}
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pvc-" + string(pvc.UID), Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": volumeProvisioner}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]},
				AccessModes:                   pvc.Spec.AccessModes,
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				StorageClassName:              *pvc.Spec.StorageClassName,
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
			},
		}
		c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	}
	pvs, err := c.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, pv := range pvs.Items {
		if (pv.Spec.StorageClassName == StorageClass || pv.Spec.StorageClassName == StorageClassNoIdmap) &&
			pv.Status.Phase == corev1.VolumeReleased && pv.DeletionTimestamp == nil {
			if err := c.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err == nil && c.node != nil && pv.Spec.HostPath != nil {
				c.node.removeVolume(pv.Spec.HostPath.Path)
			}
		}
	}
}
